"""Progress lines for long loops (evaluation, int8 calibration, scoring a .tflite file), standard library only: the
converter's LiteRT code uses them without loading Keras. A training epoch's lines: ``vit_keras.training.progress``."""

import time

from vit_keras.constants import PROGRESS_SECONDS


def duration(seconds):
    """1h02m, 3m10s or 42s."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Ticker:
    """Progress of a long loop over ``total`` items (images) for ``what`` ("evaluate", "int8 calibration"): a line
    every ``interval`` seconds, none for a loop that ends sooner."""

    def __init__(self, what, total, interval=PROGRESS_SECONDS, print_fn=print):
        self.what, self.total, self.interval, self.print_fn = what, total, interval, print_fn
        self.done, self.began = 0, time.monotonic()
        self.last = self.began

    def update(self, count):
        self.done += count
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last, elapsed = now, now - self.began
        rate = self.done / elapsed
        left = f", about {duration((self.total - self.done) / rate)} left" if self.total and rate else ""
        of = f" of {self.total:,}" if self.total else ""
        self.print_fn(f"{self.what}: {self.done:,}{of} images, {rate:.1f} img/s, {duration(elapsed)} elapsed{left}",
                      flush=True)
