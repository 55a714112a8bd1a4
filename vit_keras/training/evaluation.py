"""Evaluate a classifier on arrays or a stream: loss, accuracy, a per-class table and the confusion matrix; and
whether a data set's classes are the model's at all (``label_mapping``), before any accuracy is stated.

The batches are run one at a time and only sums are kept (loss, confusion counts), so a split streamed from disk
(``vit_keras.data.sources``) is evaluated in the memory of a batch.
"""

import dataclasses

import keras
import numpy as np

from vit_keras.data.augmentation import NO_AUGMENTATION, Batching
from vit_keras.ticker import Ticker


class LabelMapping:
    """How a data set's classes map to a model's outputs: ``index[k]`` is the output of data class k, or ``index``
    is None where they don't match and no accuracy can be stated; ``how`` says which, for printouts."""

    def __init__(self, index, how):
        self.index, self.how = index, how

    def __bool__(self):
        return self.index is not None

    def labels(self, data_labels):
        """The model's output indices for data label indices."""
        return self.index[np.asarray(data_labels, np.int64)]


def label_mapping(data_names, model_labels, num_classes):
    """Whether the data's class names are the model's: by name (each one of ``model_labels``), else as integer
    class indices below ``num_classes`` (a folder named 0007 is class 7), else, for a model without labels, the
    data's classes in order when there are as many. Anything else: no mapping, and the reason why."""
    data_names = [str(name) for name in data_names]
    if model_labels is not None:
        position = {name: i for i, name in enumerate(model_labels)}
        if all(name in position for name in data_names):
            same = list(model_labels) == data_names
            return LabelMapping(np.array([position[n] for n in data_names], np.int64),
                                "are the model's labels" if same else "match the model's labels by name")
    if data_names and all(name.isdigit() and int(name) < num_classes for name in data_names):
        return LabelMapping(np.array([int(n) for n in data_names], np.int64), "are read as class indices")
    if model_labels is None and len(data_names) == num_classes:
        return LabelMapping(np.arange(num_classes), "are taken in order (the model has no labels to match)")
    unknown = [n for n in data_names if model_labels is None or n not in set(model_labels)][:3]
    return LabelMapping(None, f"are not the model's: names such as {', '.join(unknown)} are neither its labels nor "
                              f"class indices below {num_classes}")


def model_batching(model, num_classes, batch_size):
    """Evaluation batches at ``model``'s input size and channels, labels as class indices."""
    height, width, channels = model.input_shape[1:]
    return Batching(num_classes, (height, width), channels, batch_size, training=False, one_hot=False)


def check_names(model, class_names):
    """``class_names``, one for each of ``model``'s outputs, or a clear error."""
    num_classes = int(model.output_shape[-1])
    if len(class_names) != num_classes:
        raise ValueError(f"The model has {num_classes} outputs but the data has {len(class_names)} classes "
                         f"({', '.join(class_names[:5])}...).")
    return class_names


def evaluate_arrays(model, images, labels, class_names, batch_size=256, precision="float32"):
    """A dict with loss (cross-entropy of the logits), accuracy, per_class rows and the confusion matrix.
    ``precision``: "float32", or "bfloat16" / "int8" where the CPU computes them fast (``predict_function``).

    Images are resized / converted to the model's input size and channels by the pipeline.
    """
    from vit_keras.data.pipeline import make_dataset

    batching = model_batching(model, len(check_names(model, class_names)), batch_size)
    return evaluate_batches(model, make_dataset(images, labels, **dataclasses.asdict(batching)), class_names,
                            total=len(images), precision=precision)


def evaluate_source(model, source, batch_size=256, mapping=None, class_names=None, precision="float32"):
    """``evaluate_arrays`` of a stream source (``vit_keras.data.sources.list_split``), read batch by batch.
    ``mapping``: the ``LabelMapping`` of the source's classes to the model's outputs (default: they are the
    same); ``class_names``: the model's, for the report (default: the source's)."""
    mapping = mapping or LabelMapping(np.arange(len(source.class_names)), "are the model's")
    class_names = check_names(model, class_names or source.class_names)
    batching = model_batching(model, len(source.class_names), batch_size)
    if keras.backend.backend() == "tensorflow":
        from vit_keras.data.stream import stream_dataset

        batches = stream_dataset(source, batching, NO_AUGMENTATION)
    else:
        from vit_keras.data.stream_batches import StreamBatches

        batches = StreamBatches(source, batching, NO_AUGMENTATION)
        batches = (batches[i] for i in range(len(batches)))
    mapped = ((x, mapping.labels(keras.ops.convert_to_numpy(y))) for x, y in batches)
    return evaluate_batches(model, mapped, class_names, total=len(source), precision=precision)


def evaluate_batches(model, batches, class_names, total=None, precision="float32"):
    """``evaluate_arrays``'s dict from (images, class indices) batches at the model's input (``total`` images, for
    the progress lines of a long evaluation)."""
    from vit_keras.inference.predict import predict_function

    forward, num_classes = predict_function(model, precision=precision), len(class_names)
    ticker = Ticker("evaluate", total)
    loss, count = 0.0, 0
    confusion = np.zeros((num_classes, num_classes), np.int64)
    for x, y in batches:
        logits = np.asarray(keras.ops.convert_to_numpy(forward(keras.ops.convert_to_tensor(x))), np.float64)
        labels = np.asarray(keras.ops.convert_to_numpy(y), np.int64)
        log_probs = logits - logits.max(1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
        loss -= float(log_probs[np.arange(len(labels)), labels].sum())
        count += len(labels)
        np.add.at(confusion, (labels, logits.argmax(1)), 1)
        ticker.update(len(labels))
    if not count:
        raise ValueError("There are no images to evaluate.")
    return report(confusion, class_names, loss / count)


def report(confusion, class_names, loss):
    """The evaluation dict of a confusion matrix (rows: labels, columns: predictions) and the mean loss."""
    per_class = []
    for i, name in enumerate(class_names):
        support, predicted, correct = confusion[i].sum(), confusion[:, i].sum(), confusion[i, i]
        recall = correct / support if support else float("nan")
        precision = correct / predicted if predicted else float("nan")
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        per_class.append(dict(name=name, support=int(support), precision=float(precision), recall=float(recall),
                              f1=float(f1)))
    examples = int(confusion.sum())
    return dict(loss=loss, accuracy=float(np.trace(confusion) / examples), examples=examples, per_class=per_class,
                confusion=confusion)


def format_report(result):
    """The evaluation as text: totals, then one row per class."""
    width = max(12, *(len(row["name"]) for row in result["per_class"]))
    lines = [f"loss {result['loss']:.4f}   accuracy {result['accuracy']:.4f}   ({result['examples']} images)", "",
             f"{'class':<{width}}  {'precision':>9}  {'recall':>7}  {'f1':>6}  {'support':>7}"]
    for row in result["per_class"]:
        lines.append(f"{row['name']:<{width}}  {row['precision']:>9.4f}  {row['recall']:>7.4f}  {row['f1']:>6.4f}  "
                     f"{row['support']:>7d}")
    return "\n".join(lines)
