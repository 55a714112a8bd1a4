"""A short measured warm-up: the seconds a training and a validation image take on this machine, for the model a
fine-tuning run would train at a given input size, compiled as its fit compiles it.

The image size a fine-tune picks on CPUs (``vit_keras.training.finetune``) follows the estimated time of its fit; a
fixed table of images a second is off by a third from one CPU to the next, so the estimate starts from steps run
here: the run's model (random weights: the time is the same), its batch, optimizer, accumulation and micro-batches,
on one repeated synthetic batch fed as the fit's data is, until a few seconds of steps have passed after compiling.
"""

import gc
import time

import keras
import numpy as np

from vit_keras.training import strategies
from vit_keras.training.building import build_model_to_train, compile_for_fit
from vit_keras.training.finetune import StepTimes

TRAIN_SECONDS = 8.0  # of training steps timed after the first (compiling) one
EVALUATE_SECONDS = 3.0
MIN_TIMED = 2  # executions timed at least, however long they take
WARMUP_CLASSES = 10  # the head's width barely changes a step's time
CHANNELS = 3  # a named ViT's pretrained weights take RGB; a saved model keeps its own channels


class RepeatedBatch(keras.utils.PyDataset):
    """One synthetic batch, ``steps`` times: a step's compute without the cost of reading data."""

    def __init__(self, batch_size, side, channels, steps, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.images = rng.uniform(0, 255, (batch_size, side, side, channels)).astype("float32")
        self.labels = np.eye(WARMUP_CLASSES, dtype="float32")[rng.integers(0, WARMUP_CLASSES, batch_size)]
        self.steps = steps

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        return self.images, self.labels


def repeated_batch(batch_size, side, channels, steps, seed=0):
    """One synthetic batch ``steps`` times, fed as a fit feeds its data: tf.data under TensorFlow (a
    ``keras.utils.PyDataset`` there timed ViT-Ti/16 steps a quarter slower than tf.data does), else a
    ``RepeatedBatch`` (``vit_keras.training.inputs``)."""
    batch = RepeatedBatch(batch_size, side, channels, steps, seed)
    if keras.backend.backend() != "tensorflow":
        return batch
    import tensorflow as tf

    return tf.data.Dataset.from_tensors((batch.images, batch.labels)).repeat(steps)


class StepClock(keras.callbacks.Callback):
    """Marks (time, steps done) at each batch end; stops the loop once ``seconds`` have passed after the first
    mark (at least ``MIN_TIMED`` marks later)."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.marks, self.started = seconds, [], None

    def mark(self, step):
        self.marks.append((time.perf_counter(), step + 1))
        first = self.marks[0][0]
        if len(self.marks) > MIN_TIMED and self.marks[-1][0] - first >= self.seconds:
            self.model.stop_training = self.model.stop_evaluating = True

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_test_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.mark(batch)

    def on_test_batch_end(self, batch, logs=None):
        self.mark(batch)

    def per_step(self):
        """(seconds a step after the first execution, seconds before the first mark beyond its steps' time)."""
        (first, first_steps), (last, last_steps) = self.marks[0], self.marks[-1]
        step = (last - first) / max(last_steps - first_steps, 1)
        return step, max(first - self.started - step * first_steps, 0.0)


def step_times(config, side, dist=None, model=None):
    """``StepTimes`` of ``config``'s (a ``TrainConfig``) model at ``side`` px on this machine, measured; ``model``:
    a model in hand to measure (a ``VisionTransformer``; its copy at that size) instead of ``config``'s."""
    trial = config.chosen(image_size=side)
    with strategies.scope(dist):
        if model is None:
            model = build_model_to_train(WARMUP_CLASSES, CHANNELS, (side, side), trial, side, pretrained=False)
        else:
            model = model.rebuild(image_size=side, num_classes=WARMUP_CLASSES, patch_dropout=trial.patch_dropout)
        plan, _ = compile_for_fit(model, trial, steps_per_epoch=10_000, dist=dist)
    batch = config.batch_size // plan.accumulation
    data = repeated_batch(batch, side, model.get_config()["channels"], steps=10_000, seed=config.seed)
    train_clock, test_clock = StepClock(TRAIN_SECONDS), StepClock(EVALUATE_SECONDS)
    with strategies.fit_scope(dist):
        model.fit(data, epochs=1, verbose=0, callbacks=[train_clock], shuffle=False)
        model.evaluate(data, verbose=0, callbacks=[test_clock])
    (train_step, train_compile), (test_step, test_compile) = train_clock.per_step(), test_clock.per_step()
    del model
    gc.collect()
    return StepTimes(side, train_step / batch, test_step / batch, train_compile + test_compile,
                     train_clock.marks[-1][0] - train_clock.started + test_clock.marks[-1][0] - test_clock.started)
