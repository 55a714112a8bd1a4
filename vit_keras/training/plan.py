"""How a run's epochs map onto ``model.fit`` calls: the steps of an epoch, the fit steps an update takes
(gradient accumulation: ``vit_keras.training.memory``), and where a resumed run goes on."""

import dataclasses

from vit_keras.constants import BACKUP_MINUTES


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """steps: optimizer updates an epoch. accumulation: fit steps an update (each takes batch_size / accumulation
    images). repeated: in memory, the step floor makes an epoch several passes over the data."""

    steps: int
    accumulation: int = 1
    repeated: bool = False

    @property
    def fit_steps(self):
        """The steps ``model.fit`` takes an epoch."""
        return self.steps * self.accumulation

    def fixed_steps(self, streamed):
        """Whether ``fit`` is told its steps an epoch (the data repeats, streams, or is fed in accumulated parts),
        rather than taking one pass."""
        return streamed or self.repeated or self.accumulation > 1

    def phases(self, start, epochs):
        """[(first epoch, end epoch, fit steps to skip in the first)]: the ``fit`` calls that run epochs from
        ``start`` (a ``vit_keras.training.backup.ResumePoint``) to ``epochs``. A start within an epoch is a call
        of its own, for the epoch's remaining steps."""
        if start.epoch >= epochs:
            return []
        if not start.step:
            return [(start.epoch, epochs, 0)]
        rest = [(start.epoch + 1, epochs, 0)] if start.epoch + 1 < epochs else []
        return [(start.epoch, start.epoch + 1, start.step), *rest]


def parse_every(every):
    """(steps, seconds) between mid-epoch backups for ``every``: "auto" (``BACKUP_MINUTES``), "epoch" (none), a
    number of steps, or "<minutes>min"."""
    if every == "auto":
        return None, BACKUP_MINUTES * 60
    if every == "epoch":
        return None, None
    if isinstance(every, str) and every.endswith("min"):
        try:
            minutes = float(every[:-3])
        except ValueError:
            minutes = -1.0
        if minutes > 0:
            return None, minutes * 60
    elif isinstance(every, int) and not isinstance(every, bool) and every >= 1:
        return every, None
    raise ValueError(f"`backup_every` must be 'auto' (every {BACKUP_MINUTES:g} minutes and each epoch), 'epoch', "
                     f"a positive int (steps) or minutes as '<m>min' (e.g. '5min'); got {every!r}.")
