"""The state a rerun resumes from: the weights and the optimizer, where in the run they are, written crash-safe.

    DIR/backup/state-e<epoch>-s<step>.npz   the model's and the optimizer's variables after <step> steps of epoch
                                            <epoch> (s0: the epoch not begun), one array a variable, by its path

Each state is written beside its place and renamed into it (``vit_keras.files.atomic_path``), and the older ones
are removed only after that, so a kill or a full disk at any moment leaves the previous state or the new one; the
position is the file's name, so weights and position can never disagree. Backups are written at each epoch's end
and, within an epoch, every ``every`` steps or, by default, every ``BACKUP_MINUTES`` of training: a kill costs at
most that much. ``resume_point`` finds the newest state that loads, saying which unreadable ones it passed over
(Keras's ``BackupAndRestore`` files, which earlier versions wrote in place, included).

The state is written by NumPy, not h5py: HDF5 meeting a full disk mid-write can crash the process (a
segmentation fault when its file object is freed), where a Python write raises ENOSPC, which becomes a
``DiskFull``. States an earlier version wrote as ``.weights.h5`` still resume.
"""

import dataclasses
import json
import os
import re
import time

import keras
import numpy as np

from vit_keras.files import DiskFull, atomic_path
from vit_keras.training.plan import parse_every

STATE_PATTERN = re.compile(r"^state-e(\d+)-s(\d+)\.(?:npz|weights\.h5)$")  # .weights.h5: an earlier version's
# What keras.callbacks.BackupAndRestore (earlier versions' backups) wrote: weights, then epoch metadata.
KERAS_BACKUPS = (("latest.weights.h5", "training_metadata.json"),
                 ("latest.weights.h5_prev", "training_metadata.json_prev"))


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run goes on: ``step`` steps into epoch ``epoch`` (0-based), from the state at ``path`` (None: the
    start)."""

    epoch: int = 0
    step: int = 0
    path: str | None = None

    def describe(self, steps_per_epoch):
        where = (f"at the start of epoch {self.epoch + 1}" if self.step == 0 else
                 f"at step {self.step:,} of {steps_per_epoch:,} in epoch {self.epoch + 1}")
        return f"resuming {where}, from {self.path}"


def state_files(folder):
    """(epoch, step, path) of each state in ``folder``, the newest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [(int(m[1]), int(m[2]), os.path.join(folder, name)) for name in names if (m := STATE_PATTERN.match(name))]
    return sorted(found, reverse=True)


def keras_backups(folder):
    """(epoch, 0, path) of the backups an earlier version wrote with Keras's BackupAndRestore, newest first."""
    found = []
    for weights, metadata in KERAS_BACKUPS:
        try:
            with open(os.path.join(folder, metadata)) as f:
                epoch = int(json.load(f)["epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if os.path.exists(os.path.join(folder, weights)):
            found.append((epoch, 0, os.path.join(folder, weights)))
    return found


def state_variables(model):
    """The variables a state holds: the model's, then its optimizer's."""
    return list(model.weights) + (list(model.optimizer.variables) if model.optimizer is not None else [])


def state_bytes(model):
    """The bytes of a state's arrays: what a backup needs on disk, about."""
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in state_variables(model))


def save_state(model, path):
    """Write the model's and its optimizer's variables to ``path`` (an .npz: key ``<index>:<variable path>``);
    the optimizer built first, as ``load_state`` builds it."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    with open(path, "wb") as f:
        np.savez(f, **{f"{i:05d}:{v.path}": keras.ops.convert_to_numpy(v)
                       for i, v in enumerate(state_variables(model))})


def load_state(model, path):
    """Load the model's and its optimizer's variables from ``path`` (the optimizer built first, so they exist);
    a ValueError where the file holds other variables."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    if not path.endswith(".npz"):
        model.load_weights(path)  # an earlier version's .weights.h5
        return
    variables = state_variables(model)
    with np.load(path) as data:
        keys = sorted(data.files)  # in variable order (paths may differ: an optimizer's name gets a number)
        if len(keys) != len(variables):
            raise ValueError(f"it holds {len(keys)} variables, not this model's and optimizer's {len(variables)}")
        values = [data[key] for key in keys]
    for key, variable, value in zip(keys, variables, values):
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{key} has shape {value.shape} there, {variable.path} {tuple(variable.shape)} here")
    for variable, value in zip(variables, values):
        variable.assign(value)


def resume_point(model, folder, log=print):
    """The newest state in ``folder`` that loads into ``model`` (loaded), or the start; each unreadable one is
    named by ``log`` and passed over."""
    for epoch, step, path in state_files(folder) + keras_backups(folder):
        try:
            load_state(model, path)
        except Exception as error:  # h5py and Keras raise many types for a torn or foreign file
            log(f"backup {path} is unreadable ({type(error).__name__}: {error}); trying an older one.")
            continue
        return ResumePoint(epoch, step, path)
    return ResumePoint()


class Backup(keras.callbacks.Callback):
    """Writes the training state into ``folder`` at each epoch's end and within epochs as ``every`` says
    (``parse_every``), at whole updates only (``accumulation`` steps make one). ``start``: the run's
    ``ResumePoint`` (its first epoch's steps are counted from there). Put it last among the callbacks: an epoch
    counts as done for a rerun only once the others (history, checkpoint) have recorded it."""

    def __init__(self, folder, every="auto", accumulation=1, start=ResumePoint()):
        super().__init__()
        self.folder, self.accumulation, self.start = folder, accumulation, start
        self.every_steps, self.every_seconds = parse_every(every)
        self.epoch, self.offset, self.last_step, self.last_time = start.epoch, start.step, start.step, None

    def on_train_begin(self, logs=None):
        self.last_time = time.monotonic()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.offset = self.start.step if epoch == self.start.epoch else 0
        self.last_step = self.offset

    def on_train_batch_end(self, batch, logs=None):
        step = self.offset + batch + 1
        if step % self.accumulation:
            return  # inside an accumulated update: the optimizer holds a partial sum
        due_by_steps = self.every_steps is not None and step - self.last_step >= self.every_steps
        due_by_time = self.every_seconds is not None and time.monotonic() - self.last_time >= self.every_seconds
        if due_by_steps or due_by_time:
            self.save(self.epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        self.save(epoch + 1, 0)

    def save(self, epoch, step):
        """Write the state after ``step`` steps of ``epoch``, then remove the older ones."""
        path = os.path.join(self.folder, f"state-e{epoch:05d}-s{step:09d}.npz")
        try:
            with atomic_path(path, state_bytes(self.model)) as temp:
                save_state(self.model, temp)
        except DiskFull as error:
            newest = [older for *_, older in state_files(self.folder)]
            resume = (f"The run's newest backup, {newest[0]}, is intact: rerun the same command to resume from it."
                      if newest else "The run has no backup yet: a rerun starts its first epoch again.")
            raise DiskFull(error.errno, f"{error.strerror} {resume}") from error
        for *_, older in state_files(self.folder):
            if older != path:
                os.remove(older)
        for names in KERAS_BACKUPS:  # an earlier version's backup is superseded
            for name in names:
                if os.path.exists(os.path.join(self.folder, name)):
                    os.remove(os.path.join(self.folder, name))
        self.last_step, self.last_time = step, time.monotonic()
