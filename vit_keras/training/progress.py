"""What a training log shows while an epoch runs: Keras's bar on a terminal; elsewhere a line every so often.

A log file would hold every redraw of Keras's progress bar, so where stdout is not a terminal ``fit`` prints one
line an epoch (``verbose=2``). A streamed epoch at 224 px takes most of an hour on two cores, so ``ProgressLog``
adds a line at the first step and then every ``PROGRESS_SECONDS``: the images done, their rate, the elapsed time
and the time left.
"""

import sys
import time

import keras

from vit_keras.constants import PROGRESS_SECONDS
from vit_keras.ticker import duration


def fit_verbosity(verbose, stream=None):
    """model.fit's ``verbose``: "auto" is a progress bar on a terminal and one line an epoch elsewhere (a log file
    would otherwise hold every redraw of the bar)."""
    if verbose != "auto":
        return verbose
    return 1 if is_terminal(stream) else 2


def is_terminal(stream=None):
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class ProgressLog(keras.callbacks.Callback):
    """A line at an epoch's first step and then every ``interval`` seconds: "epoch 1/3: 9,872 of 44,928 images
    (22%), 17.8 img/s, loss 2.3100, 9m14s elapsed, about 32m50s left". ``images_per_step``: the images a fit step
    takes; ``steps``: the steps of a whole epoch; ``start_step``: where the run's first epoch resumes."""

    def __init__(self, images_per_step, steps, epochs, start_epoch=0, start_step=0, interval=PROGRESS_SECONDS,
                 print_fn=print):
        super().__init__()
        self.images_per_step, self.steps, self.epochs, self.interval = images_per_step, steps, epochs, interval
        self.start_epoch, self.start_step, self.print_fn = start_epoch, start_step, print_fn
        self.epoch = self.offset = 0
        self.began = self.last = self.first = None
        self.printed = False

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.offset = self.start_step if epoch == self.start_epoch else 0
        self.began, self.last, self.first = time.monotonic(), None, None

    def on_train_batch_end(self, batch, logs=None):
        now = time.monotonic()
        if self.last is not None and now - self.last < self.interval:
            return
        self.last, done = now, batch + 1  # steps of this session's part of the epoch
        step, elapsed = self.offset + done, now - self.began
        where = (f"epoch {self.epoch + 1}/{self.epochs}: {step * self.images_per_step:,} of "
                 f"{self.steps * self.images_per_step:,} images ({step / self.steps:.0%})")
        loss = (logs or {}).get("loss")
        loss = f", loss {float(loss):.4f}" if loss is not None else ""
        if self.first is None:  # its time includes compiling the step: the rate is measured from here on
            self.first = (done, now)
            if not self.printed:  # said once a fit: later epochs' first steps are quick
                self.print_fn(f"{where}, first step after {duration(elapsed)}{loss}", flush=True)
                self.printed = True
            return
        rate = (done - self.first[0]) * self.images_per_step / max(now - self.first[1], 1e-9)
        left = (self.steps - step) * self.images_per_step / rate if rate else 0.0
        self.print_fn(f"{where}, {rate:.1f} img/s{loss}, {duration(elapsed)} elapsed, about {duration(left)} left",
                      flush=True)

