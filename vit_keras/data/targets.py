"""The training targets a distilling run's pipelines make from each augmented batch (training.distill)."""

import keras

DISTILL_WEIGHT = 0.5  # DeiT's: the data's labels and the teacher's count alike


def hard_targets(labels, teacher_logits, weight=DISTILL_WEIGHT):
    """(1 - weight) · labels + weight · onehot(argmax teacher_logits): the student's targets (backend tensors)."""
    ops = keras.ops
    labels = ops.cast(labels, "float32")
    teacher_labels = ops.one_hot(ops.argmax(teacher_logits, axis=-1), ops.shape(labels)[-1], dtype="float32")
    return (1.0 - weight) * labels + weight * teacher_labels
