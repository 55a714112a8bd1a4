"""A run directory: callbacks that checkpoint, back up and log a ``fit``, and atomic file writes.

    DIR/model.keras        the final model            DIR/checkpoint.keras  the last good epoch
    DIR/history.csv        one row per epoch           DIR/backup/           the state a rerun resumes from
    DIR/config.json        the resolved config         DIR/logs/             TensorBoard
    DIR/labels.txt         class names in label order
"""

import csv
import importlib.util
import json
import os
import shutil
import time

import keras
import numpy as np

from vit_keras import framework
from vit_keras.files import DISK_FULL, DiskFull, atomic_path, disk_full, write_text
from vit_keras.training.backup import Backup, ResumePoint, resume_point, state_bytes


class NonFiniteLoss(RuntimeError):
    """Raised when the loss turns NaN or Inf; the last good checkpoint is left in place."""


class StopOnNonFiniteLoss(keras.callbacks.TerminateOnNaN):
    """TerminateOnNaN that raises at once, before any epoch-end callback can save the bad weights."""

    def __init__(self, checkpoint_path):
        super().__init__(raise_error=True)
        self.checkpoint_path = checkpoint_path
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(loss):
            self.stop(f"Loss became {loss} at epoch {self.epoch + 1}, batch {batch + 1}")

    def on_epoch_end(self, epoch, logs=None):
        # A loss is computed before its step's update, so the epoch's last update is checked on the
        # weights themselves, before the checkpoint (a later callback) can save them.
        if not all(np.isfinite(keras.ops.convert_to_numpy(w)).all() for w in self.model.trainable_weights):
            self.stop(f"The weights became NaN or Inf in the last steps of epoch {epoch + 1}")

    def stop(self, what):
        kept = (f"the last good checkpoint is kept at {self.checkpoint_path}"
                if os.path.exists(self.checkpoint_path) else "no epoch had finished, so there is no checkpoint")
        raise NonFiniteLoss(f"{what}; stopping. {kept.capitalize()}. Try a lower learning "
                            "rate or --precision float32, with a new --out or --overwrite.")


def clocks():
    """(wall seconds, CPU seconds of this process)."""
    return time.perf_counter(), sum(os.times()[:2])


class Throughput(keras.callbacks.Callback):
    """Training images per second of each epoch (wall clock, validation excluded) as ``img_per_s``, and the
    CPU seconds of its training steps as ``cpu_s`` (robust to a shared CPU)."""

    def __init__(self, batch_size):
        super().__init__()
        self.batch_size = batch_size

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.steps, self.train_end = clocks(), 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.steps = batch + 1

    def on_test_begin(self, logs=None):  # the epoch's validation starts: its training steps are done
        self.train_end = self.train_end or clocks()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self.steps:
            (wall, cpu), (wall0, cpu0) = self.train_end or clocks(), self.start
            logs["img_per_s"] = self.steps * self.batch_size / (wall - wall0)
            logs["cpu_s"] = cpu - cpu0


def make_callbacks(out_dir, batch_size, worker=None, backup_every="auto", tensorboard=True, accumulation=1,
                   start=None, progress=None):
    """Checkpoint, backup (resume), CSV history, TensorBoard, NaN stop and throughput callbacks.

    ``batch_size``: the images a fit step takes. ``worker``: a non-chief multi-worker task's name; its files go
    to a sub-folder of its own. ``accumulation``: fit steps an update (backups fall between updates). ``start``:
    the ``vit_keras.training.backup.ResumePoint`` the model was restored to (``train`` restores it, mid-epoch
    included); None: the backup restores its newest state itself when ``fit`` starts, from that state's epoch
    (for a ``fit`` of your own). ``progress``: a ``vit_keras.training.progress.ProgressLog`` to add.
    """
    work = work_dir(out_dir, worker)
    os.makedirs(work, exist_ok=True)
    checkpoint = os.path.join(work, "checkpoint.keras")
    callbacks = [
        StopOnNonFiniteLoss(checkpoint),
        Throughput(batch_size),
        AtomicCheckpoint(checkpoint),
        HistoryLog(os.path.join(work, "history.csv"), append=True),
    ]
    if progress is not None:
        callbacks.append(progress)
    if tensorboard and importlib.util.find_spec("tensorflow") is None:  # Keras writes its logs with tf.summary
        print("TensorBoard logs need TensorFlow, which is not installed: this run writes none.")
        tensorboard = False
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(work, "logs"), update_freq="epoch"))
    # The backup decides where a rerun resumes, so it is written last: a kill before it means the epoch's end is
    # redone (and its history row replaced), never an epoch that resumes as done but was not logged. It is
    # deleted by `remove_backups` once the final model is saved.
    folder = backup_dir(out_dir, worker)
    if start is None:
        callbacks.append(RestoringBackup(folder, backup_every, accumulation))
    else:
        callbacks.append(Backup(folder, backup_every, accumulation, start))
    return callbacks


class RestoringBackup(Backup):
    """A ``Backup`` that restores the newest state itself when ``fit`` starts, from the start of that state's epoch
    (one ``fit`` call cannot begin mid-epoch; ``vit_keras.training.train`` resumes at the step)."""

    def on_train_begin(self, logs=None):
        self.start = resume_point(self.model, self.folder)
        if self.start.path:
            framework.set_initial_epoch(self.model, self.start.epoch)
            self.start = ResumePoint(self.start.epoch, 0, self.start.path)
        super().on_train_begin(logs)


def work_dir(out_dir, worker=None):
    """Where a task writes: the run folder for the chief, ``.<worker>`` inside it for another task."""
    return out_dir if worker is None else os.path.join(out_dir, f".{worker}")


def backup_dir(out_dir, worker=None):
    return os.path.join(work_dir(out_dir, worker), "backup")


def worker_names(out_dir):
    """The non-chief tasks that have written into ``out_dir`` (``worker-1``, ...)."""
    return [name[1:] for name in os.listdir(out_dir) if name.startswith(".worker-")]


def remove_backups(out_dir):
    """Delete a finished run's backups, the chief's and every worker's, once its model and config are written:
    a kill before then resumes every task from the same epoch."""
    for worker in (None, *worker_names(out_dir)):
        shutil.rmtree(backup_dir(out_dir, worker), ignore_errors=True)


def clear_run(out_dir):
    """Remove a previous run's history, checkpoint, backup, TensorBoard logs and final model from ``out_dir``."""
    for name in ("history.csv", "checkpoint.keras", "model.keras", TEACHER_FILE):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            os.remove(path)
    folders = [os.path.join(out_dir, name) for name in ("backup", "logs")]
    for path in folders + [work_dir(out_dir, worker) for worker in worker_names(out_dir)]:
        shutil.rmtree(path, ignore_errors=True)


def clean_history(path):
    """Keep the last row of each epoch in a CSV history (a resumed epoch is logged again)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    if len(lines) < 2:
        return
    header, rows = lines[0], {}
    fields = header.count(",")
    for line in lines[1:]:
        if line == header or line.count(",") != fields:  # a repeated header, or a row cut short by a kill
            continue
        rows[int(line.split(",")[0])] = line
    write_text(path, "\n".join([header, *(rows[k] for k in sorted(rows))]) + "\n")


TEACHER_FILE = "teacher.keras"  # a distilling run's CNN teacher: a resumed run learns from the same one

# Settings config.json has recorded only since they were added; a record from before lacks them. Their effect
# shows in keys it has (min_steps: in steps_per_epoch and augment), so a finished run from then is not redone.
ADDED_KEYS = ("min_steps", "distill", "teacher_steps", "erase", "optimizer", "accumulation", "patch_dropout")
# VisionTransformer arguments added since: a model recorded without one was built with its default.
ADDED_MODEL_KEYS = {"locality_attention": False, "patch_dropout": 0.0}


class RunConflict(ValueError):
    """The run folder holds a run with other settings: training there would delete or mix with it."""


def differences(previous, recorded):
    """["name: old -> new", ...] of the recorded settings in which ``previous`` (config.json) and ``recorded``
    differ, the model's (``vit``) setting by setting. A setting added since ``previous`` was written counts as
    the same (``ADDED_KEYS``, ``ADDED_MODEL_KEYS``)."""
    changed = []
    for key, value in recorded.items():
        if key not in previous and key in ADDED_KEYS:
            continue
        old = previous.get(key)
        if key == "vit" and isinstance(old, dict) and isinstance(value, dict):
            # class_names joined the model's config later; the record's own class_names held them already
            old = {**ADDED_MODEL_KEYS, "class_names": value.get("class_names"), **old}
            value = {**ADDED_MODEL_KEYS, **value}  # a model config without one has its default
            changed += [f"vit.{name}: {old.get(name)!r} -> {value.get(name)!r}"
                        for name in sorted(set(old) | set(value)) if old.get(name) != value.get(name)]
        elif old != value:
            changed.append(f"{key}: {old!r} -> {value!r}")
    return changed


def check_out_dir(out_dir):
    """A ``RunConflict`` where ``out_dir`` is a file."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RunConflict(f"`out` {out_dir!r} is a file, not a folder: choose another --out.")


def start_run(out_dir, record, chief=True, overwrite=False):
    """Make ``out_dir`` ready for the run ``record`` (its config.json) describes. Returns the folder's record
    when it holds this run finished (nothing to do), else None: a run cut short resumes. A folder holding a run
    with other settings raises ``RunConflict`` naming them, unless ``overwrite``: then that run's files go. The
    chief writes config.json and labels.txt."""
    check_out_dir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    config_path = os.path.join(out_dir, "config.json")
    previous = read_json(config_path)
    recorded = json.loads(json.dumps(record, default=str))  # as config.json holds it
    if not previous and os.path.exists(config_path):
        raise RunConflict(f"{config_path} is unreadable, so the run in {out_dir} can't be resumed or compared: "
                          "pass --overwrite (overwrite=True) to start afresh there, or choose another --out.")
    changed = differences(previous, recorded) if previous else []
    if previous.get("completed") and not changed and not overwrite:
        print(f"{out_dir} already holds this finished run; nothing to do (--overwrite retrains it).")
        return previous
    if changed and not overwrite:
        held = "a finished model (model.keras)" if previous.get("completed") else "a run cut short"
        raise RunConflict(f"{out_dir} holds {held} with other settings ({'; '.join(changed[:8])}"
                          f"{'; ...' if len(changed) > 8 else ''}). Rerun with the same settings to resume it, pass "
                          "--overwrite (overwrite=True) to delete it and start afresh, or choose another --out.")
    if previous and overwrite and chief:
        print(f"{out_dir} held a run{' with other settings' if changed else ''}; starting afresh there (--overwrite).")
        clear_run(out_dir)
    if chief:
        write_json(config_path, record)
        write_text(os.path.join(out_dir, "labels.txt"), "\n".join(record["class_names"]) + "\n")
    return None


def finish_run(out_dir, model, record, seconds, chief=True):
    """The record completed with the fit's time and final metrics. The chief saves the model and the record,
    then removes the backups, the workers' too: until the run is complete, a rerun must resume everywhere."""
    history_path = os.path.join(out_dir, "history.csv")
    if chief:
        clean_history(history_path)
    record = dict(record, completed=True, fit_seconds_last_session=round(seconds, 1),
                  **last_epoch_metrics(history_path))
    if chief:
        save_model(model, os.path.join(out_dir, "model.keras"))
        write_json(os.path.join(out_dir, "config.json"), record)
        remove_backups(out_dir)
    return record


def last_epoch_metrics(history_path):
    """The final epoch's metrics from a CSV history, as floats named ``final_<metric>``."""
    try:
        with open(history_path) as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return {}
    return {f"final_{k}": float(v) for k, v in rows[-1].items() if k != "epoch" and v} if rows else {}


def data_split(model_path, data=None):
    """How to read ``data`` to evaluate the model at ``model_path``, from its run's config.json (beside it).

    A folder's seeded held-out part is the same only with the seed and fraction it was trained with: {seed,
    val_fraction}. A folder the run was not trained on is read whole ({whole_folder: True}): its every image is unseen.
    Without ``data``, the recorded split of the training data.
    """
    config = read_json(os.path.join(os.path.dirname(os.path.abspath(model_path)), "config.json"))
    split = {key: config[key] for key in ("seed", "val_fraction") if key in config}
    if data is None or not str(data).startswith("folder:"):
        return split
    trained = str(config.get("data", ""))
    same = trained.startswith("folder:") and os.path.realpath(trained[7:]) == os.path.realpath(str(data)[7:])
    return split if same else {"whole_folder": True}


def recorded_choices(out_dir):
    """The choices a fine-tune made of the run ``out_dir`` holds (its config.json): ``image_size``, the model's
    side (None where it holds none), and its ``epochs`` and ``warmup_epochs``."""
    record = read_json(os.path.join(out_dir, "config.json"))
    size = (record.get("vit") or {}).get("image_size")
    return dict(image_size=max(size) if isinstance(size, list) and size else None, epochs=record.get("epochs"),
                warmup_epochs=record.get("warmup_epochs"))


def read_json(path):
    """A JSON file's content, or {} when it is missing or unreadable (a run not started, or cut short)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_json(path, data):
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def save_model(model, path):
    """Atomic ``model.save``: Keras writes a temp ``.keras`` that then replaces ``path``."""
    with atomic_path(path, state_bytes(model)) as temp:
        model.save(temp)


class AtomicCheckpoint(keras.callbacks.Callback):
    """The model at each epoch's end, saved atomically: a kill during the save keeps the previous one.
    (keras.callbacks.ModelCheckpoint writes the file in place.)"""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        save_model(self.model, self.path)


class HistoryLog(keras.callbacks.CSVLogger):
    """Keras's CSV history, appended a row an epoch (``clean_history`` drops a row a kill cut short); a full disk
    is a ``DiskFull`` naming the file, not a bare [Errno 28]."""

    def on_epoch_end(self, epoch, logs=None):
        try:
            super().on_epoch_end(epoch, logs)
        except OSError as error:
            if error.errno in DISK_FULL and not isinstance(error, DiskFull):
                raise disk_full(self.filename, error) from error
            raise
