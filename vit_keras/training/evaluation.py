"""Evaluate a classifier on arrays: loss, accuracy, a per-class table and the confusion matrix."""

import numpy as np

from vit_keras.inference.predict import predict


def evaluate_arrays(model, images, labels, class_names, batch_size=256):
    """A dict with loss (cross-entropy of the logits), accuracy, per_class rows and the confusion matrix.

    Images are resized / converted to the model's input size and channels by the pipeline.
    """
    from vit_keras.data.pipeline import make_dataset

    height, width, channels = model.input_shape[1:]
    num_classes = int(model.output_shape[-1])
    if len(class_names) != num_classes:
        raise ValueError(f"The model has {num_classes} outputs but the data has {len(class_names)} classes "
                         f"({', '.join(class_names[:5])}...).")
    dataset = make_dataset(images, labels, num_classes, image_size=(height, width), channels=channels,
                           batch_size=batch_size, one_hot=False)
    logits = np.asarray(predict(model, dataset), np.float64)
    labels = np.asarray(labels, np.int64)
    log_probs = logits - logits.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    loss = float(-log_probs[np.arange(len(labels)), labels].mean())
    predictions = logits.argmax(1)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    per_class = []
    for i, name in enumerate(class_names):
        support, predicted, correct = confusion[i].sum(), confusion[:, i].sum(), confusion[i, i]
        recall = correct / support if support else float("nan")
        precision = correct / predicted if predicted else float("nan")
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        per_class.append(dict(name=name, support=int(support), precision=float(precision), recall=float(recall),
                              f1=float(f1)))
    return dict(loss=loss, accuracy=float((predictions == labels).mean()), examples=len(labels),
                per_class=per_class, confusion=confusion)


def format_report(result):
    """The evaluation as text: totals, then one row per class."""
    width = max(12, *(len(row["name"]) for row in result["per_class"]))
    lines = [f"loss {result['loss']:.4f}   accuracy {result['accuracy']:.4f}   ({result['examples']} images)", "",
             f"{'class':<{width}}  {'precision':>9}  {'recall':>7}  {'f1':>6}  {'support':>7}"]
    for row in result["per_class"]:
        lines.append(f"{row['name']:<{width}}  {row['precision']:>9.4f}  {row['recall']:>7.4f}  {row['f1']:>6.4f}  "
                     f"{row['support']:>7d}")
    return "\n".join(lines)

