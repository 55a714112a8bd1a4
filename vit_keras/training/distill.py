"""DeiT's hard-label distillation (Touvron et al. 2021, section 5) from a small CNN teacher, for small data.

On a few thousand images a ViT learns locality slowly, and a small CNN has it built in. So the CNN trains
first, for a small share of the budget, and the ViT then learns from its labels as well as the data's:
    target = (1 - w) · y + w · onehot(argmax teacher(x)),   w = 1/2

Cross-entropy is linear in its target, so one head trained on this learns DeiT's
(1 - w) · CE(student(x), y) + w · CE(student(x), y_teacher) (DeiT's "hard distillation" with the class token
alone). The teacher labels each augmented image as the student sees it (after the crops, flips and mixing),
so the input pipelines make these targets (``vit_keras.data.pipeline``, ``vit_keras.data.array_pipeline``); the model,
its training step and its export stay as they are, and only the ViT is saved as the run's model.
"""

import os
import time

import keras

from vit_keras.data.targets import DISTILL_WEIGHT, hard_targets  # noqa: F401  (the targets this module trains for)
from vit_keras.framework import build_optimizer
from vit_keras.training.runs import TEACHER_FILE, save_model

TEACHER_LEARNING_RATE = 1e-3


def small_cnn(input_shape, num_classes, name="small_cnn"):
    """The classic Keras MNIST convnet, on raw 0-255 pixels:
    Conv 3x3 x32, ReLU, MaxPool 2 -> Conv 3x3 x64, ReLU, MaxPool 2 -> Dropout 0.5 -> Flatten -> Dense(classes).
    """
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Dropout(0.5),
        keras.layers.Flatten(),
        keras.layers.Dense(num_classes),
    ], name=name)


def compile_teacher(model):
    """Adam at 1e-3 on one-hot labels, no augmentation, as the Keras example trains it."""
    model.compile(keras.optimizers.Adam(TEACHER_LEARNING_RATE),
                  keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")])
    return model


def train_teacher(batches, input_shape, num_classes, steps, seed=0, val_batches=None):
    """``small_cnn`` trained for ``steps`` steps on ``batches`` (repeating, un-augmented (image, one-hot label)
    batches at the student's input); prints its accuracy on ``val_batches``."""
    keras.utils.set_random_seed(seed)
    teacher = compile_teacher(small_cnn(input_shape, num_classes))
    start = time.perf_counter()
    build_optimizer(teacher)  # traced once, not twice
    teacher.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)  # the pipeline shuffles
    report = (f"teacher: small CNN ({teacher.count_params():,} parameters), {steps:,} steps in "
              f"{time.perf_counter() - start:.0f} s")
    if val_batches is not None:
        accuracy = teacher.evaluate(val_batches, verbose=0, return_dict=True)["accuracy"]
        report += f", {100 * accuracy:.2f}% on the validation images"
    print(report)
    return teacher


def run_teacher(out_dir, train, save=True):
    """The run folder's teacher: ``teacher.keras`` when a run cut short left one, else ``train()``'s, saved
    atomically (``save``: by the chief of several workers) before the student starts."""
    path = os.path.join(out_dir, TEACHER_FILE)
    if os.path.exists(path):
        print(f"teacher: {path} (the run's own, from before it was cut short)")
        return keras.saving.load_model(path, safe_mode=True)
    teacher = train()
    if save:
        save_model(teacher, path)
    return teacher


