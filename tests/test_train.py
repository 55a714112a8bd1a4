"""vit_keras.training.train and the train/evaluate commands: recipe, precision, tf.distribute, resumption, NaN, CLI."""

import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import vit_keras
from vit_keras.apps import cli
from disks import full_disk
from vit_keras.training import backup, runs
from vit_keras.training import train
from vit_keras.data.augmentation import Augmentation
from vit_keras.data.datasets import FASHION_MNIST_CLASSES
from vit_keras.data.pipeline import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1)
TINY_ARGS = ["--hidden-size", "32", "--num-heads", "2", "--mlp-dim", "64", "--num-layers", "1"]


def tiny_model(**kw):
    config = {**TINY, "pooling": "gap", "class_token": False, **kw}
    return vit_keras.VisionTransformer(image_size=28, patch_size=7, channels=1, num_classes=10,
                                       include_preprocessing=True, **config)


@pytest.fixture(scope="module")
def fashion(fashion_train):
    images, labels = fashion_train
    return images[:512], labels[:512], list(FASHION_MNIST_CLASSES)


def test_warmup_cosine_schedule_and_serialization():
    schedule = train.WarmupCosine(1e-3, total_steps=100, warmup_steps=10, end=1e-5)
    lr = [float(schedule(s)) for s in (0, 5, 10, 55, 100, 150)]
    np.testing.assert_allclose(lr, [0, 5e-4, 1e-3, 0.5 * (1e-3 + 1e-5), 1e-5, 1e-5], rtol=1e-5, atol=1e-9)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(again, train.WarmupCosine) and again.get_config() == schedule.get_config()
    assert train.scaled_learning_rate(1e-3, 1024) == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="warmup_steps"):
        train.WarmupCosine(1e-3, total_steps=10, warmup_steps=20)


def test_a_traced_step_computes_the_scheduled_rate_once_and_follows_the_step():
    import tensorflow as tf

    schedule = train.WarmupCosine(1e-3, total_steps=100, warmup_steps=10)
    optimizer = train.make_optimizer(schedule)
    optimizer.build([keras.Variable(np.ones(3, "float32"))])

    @tf.function
    def step():
        first, second = optimizer.learning_rate, optimizer.learning_rate  # as Keras reads it, once a variable
        assert first is second  # one formula in the graph, not one a read
        optimizer.iterations.assign_add(1)
        return first

    assert [float(step()) for _ in range(3)] == pytest.approx([0.0, 1e-4, 2e-4])  # read before the increment
    assert float(optimizer.learning_rate) == pytest.approx(3e-4)  # eager reads compute it afresh
    assert float(schedule(55)) == pytest.approx(0.5e-3)


def test_no_weight_decay_on_norms_biases_position_embedding_and_cls():
    model = tiny_model(pooling="token", class_token=True)
    optimizer = train.make_optimizer(1e-3)
    decayed = {v.path for v in model.trainable_variables if optimizer._use_weight_decay(v)}
    skipped = {v.path for v in model.trainable_variables} - decayed
    assert {"embedding/pos_embedding", "embedding/cls", "embedding/bias", "encoder_norm/gamma",
            "encoder_norm/beta", "head/bias", "encoderblock_0/norm1/gamma"} <= skipped
    assert {"embedding/kernel", "head/kernel", "encoderblock_0/attn/qkv/kernel", "encoderblock_0/fc1/kernel"} <= decayed
    assert all(v.endswith("kernel") for v in decayed)
    assert optimizer.global_clipnorm == 1.0


def fit_steps(fashion, precision, steps=12, seed=0):
    """Train a tiny model for a few steps under ``precision``; returns (loss before, loss after, model)."""
    images, labels, _ = fashion
    train.set_precision(precision)
    try:
        keras.utils.set_random_seed(seed)
        model = tiny_model()
        schedule = train.WarmupCosine(3e-3, total_steps=steps, warmup_steps=2)
        train.compile_model(model, schedule, precision, jit_compile=False)
        data = make_dataset(images, labels, 10, batch_size=64, training=True, augmentation=Augmentation("none"), seed=seed)
        probe = make_dataset(images[:256], labels[:256], 10, batch_size=256)
        before = model.evaluate(probe, verbose=0, return_dict=True)["loss"]
        model.fit(data.repeat(), steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
        after = model.evaluate(probe, verbose=0, return_dict=True)["loss"]
        return before, after, model
    finally:
        train.set_precision("float32")


def test_fit_traces_the_train_step_once_and_get_config_holds_plain_values():
    """Keras's TensorFlow trainer builds the optimizer inside the step's first trace and then traces it again;
    VisionTransformer.fit builds it first. A tracked list deep-copied the model on every get_config."""
    model = tiny_model(class_names=[f"c{i}" for i in range(10)])
    model.compile(optimizer="adamw", loss="categorical_crossentropy", jit_compile=False)
    traced, step = [], model.train_step
    model.train_step = lambda data: traced.append(data) or step(data)
    images, labels = np.zeros((8, 28, 28, 1), "float32"), np.eye(10)[np.arange(8)]
    history = model.fit(images, labels, batch_size=4, epochs=2, verbose=0).history
    assert len(traced) == 1 and len(history["loss"]) == 2 and model.optimizer.iterations.numpy() == 4
    config = model.get_config()
    assert type(config["class_names"]) is list and config["class_names"][3] == "c3"
    assert type(config["image_size"]) is tuple


def test_a_few_steps_on_fashion_mnist_lower_the_loss(fashion):
    before, after, _ = fit_steps(fashion, "float32", steps=16)
    assert after < before - 0.3, (before, after)


def test_precision_policies_train_close_to_float32(fashion):
    _, reference, _ = fit_steps(fashion, "float32")
    for precision in ("mixed_float16", "mixed_bfloat16"):
        before, after, model = fit_steps(fashion, precision)
        assert after < before and abs(after - reference) < 0.1 * reference, (precision, after, reference)
        assert model.get_layer("head").compute_dtype == "float32"  # logits in float32
        block = model.get_layer("encoderblock_0")
        assert block.compute_dtype == precision.split("_")[1]
        wide = keras.ops.cast(np.tile([300.0, -300.0], (1, 4, TINY["hidden_size"] // 2)), block.compute_dtype)
        normed = keras.ops.convert_to_numpy(keras.ops.cast(block.norm1(wide), "float32"))
        assert np.isfinite(normed).all(), precision  # a variance of 9e4 overflows float16: statistics in float32
        if precision == "mixed_float16":
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(fashion, tmp_path):
    images, labels, _ = fashion
    keras.utils.set_random_seed(0)
    model = tiny_model()
    steps = len(images) // 64
    # A sane LR for epoch 1, then one large enough to overflow the logits in epoch 2.
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([steps], [1e-3, 1e30])
    train.compile_model(model, schedule, jit_compile=False, clipnorm=None)
    data = make_dataset(images, labels, 10, batch_size=64, training=True, augmentation=Augmentation("none"))
    callbacks = runs.make_callbacks(str(tmp_path), 64, tensorboard=False)
    with pytest.raises(train.NonFiniteLoss, match="last good checkpoint is kept") as error:
        model.fit(data, epochs=3, callbacks=callbacks, verbose=0, shuffle=False)
    assert "epoch 2" in str(error.value)
    good = keras.saving.load_model(tmp_path / "checkpoint.keras", compile=False)
    assert all(np.isfinite(w).all() for w in good.get_weights())
    assert not (tmp_path / "model.keras").exists()


class NanFrom(keras.optimizers.schedules.LearningRateSchedule):
    """1e-3, then a NaN learning rate from step ``step`` on (NaN weights, though the step's own loss is finite)."""

    def __init__(self, step):
        self.step = step

    def __call__(self, step):
        return keras.ops.where(step < self.step, 1e-3, float("nan"))

    def get_config(self):
        return {"step": self.step}


def test_nan_weights_from_an_epochs_last_step_are_not_checkpointed(fashion, tmp_path):
    """The last update of an epoch has no loss of its own yet: the weights are checked before the checkpoint."""
    images, labels, _ = fashion
    keras.utils.set_random_seed(0)
    model = tiny_model()
    steps = len(images) // 64
    train.compile_model(model, NanFrom(2 * steps - 1), jit_compile=False, clipnorm=None)
    data = make_dataset(images, labels, 10, batch_size=64, training=True, augmentation=Augmentation("none"))
    with pytest.raises(train.NonFiniteLoss, match="weights became NaN or Inf in the last steps of epoch 2"):
        model.fit(data, epochs=3, callbacks=runs.make_callbacks(str(tmp_path), 64, tensorboard=False), verbose=0)
    good = keras.saving.load_model(tmp_path / "checkpoint.keras", compile=False)
    assert all(np.isfinite(w).all() for w in good.get_weights())


class CrashAtEpochEnd(keras.callbacks.Callback):
    """Stands in for a kill at one point of an epoch's end: after the callbacks placed before it."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt


def fit_run(fashion, folder, epochs=3, crash_at=None):
    """A tiny model fitted with the run directory's callbacks in ``folder`` (a rerun resumes); ``crash_at``
    puts a stand-in for a kill at that place among the callbacks."""
    images, labels, _ = fashion
    data = make_dataset(images[:128], labels[:128], 10, batch_size=64, training=True, augmentation=Augmentation("none"))
    keras.utils.set_random_seed(0)
    model = tiny_model()
    train.compile_model(model, 1e-3, jit_compile=False)
    callbacks = runs.make_callbacks(str(folder), 64, tensorboard=False)
    if crash_at is not None:
        callbacks.insert(min(crash_at, len(callbacks)), CrashAtEpochEnd())
    model.fit(data, epochs=epochs, callbacks=callbacks, verbose=0, shuffle=False)


def logged_epochs(folder):
    runs.clean_history(folder / "history.csv")
    return [row.split(",")[0] for row in (folder / "history.csv").read_text().splitlines()[1:]]


@pytest.mark.parametrize("position", [2, 4, 5])  # before the checkpoint, before the backup, after all
def test_a_kill_anywhere_in_an_epoch_end_resumes_with_every_epoch_logged_once(fashion, tmp_path, position):
    with pytest.raises(KeyboardInterrupt):
        fit_run(fashion, tmp_path, crash_at=position)
    fit_run(fashion, tmp_path)
    assert logged_epochs(tmp_path) == ["0", "1", "2"]


def backup_states(folder):
    return sorted(path.name for path in (folder / "backup").glob("state-*.npz"))


def test_backups_are_whole_files_named_by_their_place_and_only_the_newest_is_kept(fashion, tmp_path):
    fit_run(fashion, tmp_path, epochs=2)
    assert backup_states(tmp_path) == ["state-e00002-s000000000.npz"], "the backup outlives fit"
    assert not [p for p in (tmp_path / "backup").iterdir() if p.name.startswith(".tmp-")]
    (tmp_path / ".worker-1" / "backup").mkdir(parents=True)  # a non-chief task's, kept until the chief is done
    runs.remove_backups(str(tmp_path))
    assert not (tmp_path / "backup").exists() and not (tmp_path / ".worker-1" / "backup").exists()


def test_a_backup_on_a_full_disk_names_it_and_the_newest_one_stays_readable(tmp_path):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512)])  # 133 KB of weights
    model.compile(optimizer="adam", loss="mse")
    with full_disk(tmp_path / "disk") as fill:
        saver = backup.Backup(str(tmp_path / "disk" / "backup"))
        saver.set_model(model)
        saver.save(1, 0)
        fill()
        with pytest.raises(OSError, match=r"the disk is full: writing .*state-e00002-s000000000.npz failed .*"
                                          r"newest backup, .*state-e00001-s000000000.npz, is intact: rerun"):
            saver.save(2, 0)
        assert backup_states(tmp_path / "disk") == ["state-e00001-s000000000.npz"]
        assert backup.resume_point(model, str(tmp_path / "disk" / "backup")).epoch == 1


def test_a_damaged_backup_is_named_and_the_run_starts_again(fashion, tmp_path, capsys):
    """No write of ours leaves a torn state (each is renamed into place whole), but a disk can damage one: the
    rerun names it and starts from epoch 1, rather than failing on the unreadable file."""
    fit_run(fashion, tmp_path, epochs=1)
    path = tmp_path / "backup" / backup_states(tmp_path)[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    fit_run(fashion, tmp_path, epochs=2)
    out = capsys.readouterr().out
    assert f"backup {path} is unreadable" in out
    assert logged_epochs(tmp_path) == ["0", "1"]


@pytest.mark.parametrize("torn", [False, True])
def test_an_earlier_versions_keras_backup_resumes_or_is_named_when_torn(fashion, tmp_path, capsys, torn):
    """Earlier versions backed up with keras.callbacks.BackupAndRestore (in place, with a _prev copy)."""
    fit_run(fashion, tmp_path, epochs=1)
    state = tmp_path / "backup" / backup_states(tmp_path)[0]
    latest = tmp_path / "backup" / "latest.weights.h5"
    keras.saving.load_model(tmp_path / "checkpoint.keras").save_weights(latest)  # as BackupAndRestore wrote it
    state.unlink()
    (tmp_path / "backup" / "training_metadata.json").write_text('{"epoch": 1, "batch": 0}')
    if torn:
        latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    fit_run(fashion, tmp_path, epochs=2)
    out = capsys.readouterr().out
    assert (f"backup {latest} is unreadable" in out) == torn
    assert logged_epochs(tmp_path) == ["0", "1"]
    assert backup_states(tmp_path) == ["state-e00002-s000000000.npz"]
    assert not latest.exists(), "the new backup supersedes the old version's"


def test_a_kill_mid_epoch_resumes_at_the_step_of_the_last_backup(tmp_path, capsys):
    """A run killed within an epoch goes on from the step of its newest backup (every 3 steps here), says where,
    and logs one history row an epoch."""
    kw = dict(limit=512, batch_size=64, epochs=2, augment="none", jit_compile=False, verbose=2, tensorboard=False,
              backup_every=3, steps_per_execution=1,
              model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:  # epoch 1's fifth step: its last backup was after step 3
                raise KeyboardInterrupt

    original = runs.make_callbacks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs, "make_callbacks", lambda *a, **k: original(*a, **k) + [Kill()])
        with pytest.raises(KeyboardInterrupt):
            train.train("fashion_mnist", str(tmp_path), **kw)
    assert backup_states(tmp_path) == ["state-e00000-s000000003.npz"]
    capsys.readouterr()
    config = train.train("fashion_mnist", str(tmp_path), **kw)
    out = capsys.readouterr().out
    assert "resuming at step 3 of 8 in epoch 1, from" in out
    assert "epoch 1/2: 256 of 512 images (50%), first step after" in out  # the progress line counts from there
    assert logged_epochs(tmp_path) == ["0", "1"] and config["completed"]


def test_a_rerun_with_another_config_is_refused_naming_what_differs(tmp_path):
    kw = dict(limit=256, batch_size=64, augment="none", jit_compile=False, verbose=0, tensorboard=False,
              model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
    train.train("fashion_mnist", str(tmp_path), epochs=2, **kw)
    model_bytes = (tmp_path / "model.keras").read_bytes()
    with pytest.raises(runs.RunConflict, match=r"holds a finished model \(model.keras\) with other settings "
                                               r"\(epochs: 2 -> 1\).*--overwrite"):
        train.train("fashion_mnist", str(tmp_path), epochs=1, **kw)
    assert (tmp_path / "model.keras").read_bytes() == model_bytes, "the finished model is untouched"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.old").write_text("the other run's curves")
    (tmp_path / ".worker-1" / "backup").mkdir(parents=True)  # a non-chief task's backup of the old run
    config = train.train("fashion_mnist", str(tmp_path), epochs=1, overwrite=True, **kw)
    rows = (tmp_path / "history.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0"] and config["epochs"] == 1 and config["completed"]
    assert config["crop_scale"] == list(train.RECIPES["quick"]["crop_scale"])  # every setting is recorded
    assert not (tmp_path / "logs").exists()  # TensorBoard would show the old run next to the new one
    assert not (tmp_path / ".worker-1").exists()  # that worker would restore the old run's state


def test_an_out_folder_that_is_a_file_or_holds_a_damaged_record_is_refused(tmp_path):
    kw = dict(limit=256, batch_size=64, epochs=1, jit_compile=False, verbose=0, tensorboard=False,
              model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(runs.RunConflict, match="is a file, not a folder"):
        train.train("fashion_mnist", str(tmp_path / "file"), **kw)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"epochs": 1, "vit"')  # cut short by another program
    with pytest.raises(runs.RunConflict, match="config.json is unreadable.*--overwrite"):
        train.train("fashion_mnist", str(tmp_path / "run"), **kw)


def test_several_steps_per_execution_train_exactly_like_one(tmp_path):
    kw = dict(limit=320, batch_size=64, epochs=1, augment="flip", jit_compile=False, verbose=0, tensorboard=False,
              model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
    weights = []
    for spe in (1, 3):  # 5 steps: one full execution of 3, then a partial one of 2
        train.train("fashion_mnist", str(tmp_path / str(spe)), steps_per_execution=spe, **kw)
        model = keras.saving.load_model(tmp_path / str(spe) / "model.keras", compile=False)
        weights.append(model.get_weights())
    assert max(float(np.abs(a - b).max()) for a, b in zip(*weights)) < 1e-6
    with pytest.raises(ValueError, match="`steps_per_execution` must be a positive int"):
        train.train("fashion_mnist", str(tmp_path / "0"), steps_per_execution=0, **kw)


@pytest.mark.parametrize("crop_scale", [(0.8, 0.5), 0.5])
def test_bad_crop_scale_fails_before_anything_is_loaded_or_written(crop_scale, tmp_path):
    with pytest.raises(ValueError, match="`crop_scale` must be"):
        train.train("fashion_mnist", str(tmp_path / "run"), crop_scale=crop_scale, verbose=0)
    assert not (tmp_path / "run").exists()


def test_unknown_keywords_to_train_name_the_nearest_valid_one(tmp_path):
    with pytest.raises(TypeError, match=r"train\(\) got unknown keyword arguments 'epoch' \(did you mean 'epochs'\?\), "
                                        r"'lr'; valid keywords are .*learning_rate"):
        train.train("fashion_mnist", str(tmp_path / "run"), epoch=3, lr=1e-3)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("options, message", [
    (dict(epochs=0), "`epochs` must be a positive int; got 0."),
    (dict(batch_size=2.5), "`batch_size` must be a positive int; got 2.5."),
    (dict(micro_batches=True), "`micro_batches` must be a positive int; got True."),
    (dict(learning_rate=0.0), "`learning_rate` must be > 0; got 0.0."),
    (dict(weight_decay=-0.1), "`weight_decay` must be >= 0; got -0.1."),
    (dict(label_smoothing=1.0), "`label_smoothing` must be in [0, 1); got 1.0."),
    (dict(drop_path="0.1"), "`drop_path` must be in [0, 1); got '0.1'."),
    (dict(mixup=-1.0), "`mixup` must be >= 0; got -1.0."),
    (dict(cutmix=float("nan")), "`cutmix` must be >= 0; got nan."),
    (dict(erase=1.5), "`erase` must be in [0, 1]; got 1.5."),
    (dict(warmup_epochs=-1), "`warmup_epochs` must be >= 0; got -1."),
    (dict(val_fraction=1.0), "`val_fraction` must be in (0, 1); got 1.0."),
    (dict(precision="float8"), "Unknown `precision`='float8'; valid values are 'float32', 'mixed_float16'"),
    (dict(strategy="horovod"), "Unknown `strategy`='horovod'; valid values are 'auto'"),
    (dict(recipe="slow"), "Unknown `recipe`='slow'; valid values are 'quick', 'long', 'finetune'."),
    (dict(augment="rotate"), "Unknown `augment`='rotate'; valid values are 'none'"),
    (dict(model_name="vit_q99"), "Unknown `model_name`='vit_q99'; valid values are 'vit_ti16'"),
    (dict(image_size=0), "`image_size` must be a positive int or a pair"),
    (dict(model_overrides=[("num_layers", 2)]), "`model_overrides` must be a dict"),
    (dict(limit=0), "`limit` must be a positive int or None; got 0."),
    (dict(seed=-1), "`seed` must be an int >= 0; got -1."),
    (dict(backup_every=0), "`backup_every` must be 'auto' (every 10 minutes and each epoch), 'epoch', a positive "
                           "int (steps) or minutes as '<m>min' (e.g. '5min'); got 0."),
    (dict(backup_every="soon"), "got 'soon'"),
    (dict(accumulate=3), "`accumulate` must be 'auto' or a positive int that divides `batch_size`=128; got 3."),
    (dict(verbose=3), "Unknown `verbose`=3; valid values are 'auto', 0, 1, 2."),
])
def test_bad_settings_fail_before_anything_is_loaded_or_written(options, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        train.train("fashion_mnist", str(tmp_path / "run"), **options)
    assert not (tmp_path / "run").exists()


def test_a_train_config_takes_unset_values_from_its_recipe_and_stays_valid():
    quick, recipe = train.TrainConfig("fashion_mnist"), train.RECIPES["quick"]
    assert (quick.epochs, quick.batch_size, quick.augment) == (recipe["epochs"], recipe["batch_size"], recipe["augment"])
    assert quick.crop_scale == list(recipe["crop_scale"])
    assert quick.learning_rate == pytest.approx(recipe["base_lr"] * recipe["batch_size"] / 512)
    long = train.TrainConfig("fashion_mnist", recipe="long", batch_size=256, drop_path=0.2)
    assert long.epochs == train.RECIPES["long"]["epochs"] and long.drop_path == 0.2
    assert long.learning_rate == pytest.approx(train.RECIPES["long"]["base_lr"] * 256 / 512)  # scaled to the batch
    assert train.TrainConfig("fashion_mnist", weights="run/model.keras").drop_path is None  # the saved model's own
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.epochs = 0
    assert dataclasses.replace(quick, epochs=3).epochs == 3
    with pytest.raises(ValueError, match="`epochs` must be a positive int"):  # a changed copy is checked again
        dataclasses.replace(quick, epochs=0)


def test_small_data_gets_the_step_floor_and_epochs_asked_for_do_not():
    quick = train.TrainConfig("fashion_mnist")
    floor = train.RECIPES["quick"]["min_steps"]
    assert quick.min_steps == floor
    assert quick.steps_per_epoch(1000) == math.ceil(floor / quick.epochs)  # 1,000 images: the floor's steps
    assert quick.augmentation(1000) == "crop"  # many passes over each image: more than flips
    assert quick.steps_per_epoch(54_000) == 421 and quick.augmentation(54_000) == "flip"  # one pass an epoch
    asked = train.TrainConfig("fashion_mnist", epochs=5)
    assert asked.min_steps == 0 and asked.steps_per_epoch(1000) == 7
    floored = train.TrainConfig("fashion_mnist", epochs=5, min_steps=100, augment="flip")
    assert floored.steps_per_epoch(1000) == 20 and floored.augmentation(1000) == "flip"  # as asked
    small_erase = train.RECIPES["quick"]["small_data_erase"]  # in full from erase_passes (200) passes over the data
    assert quick.erasing(1000) == small_erase and quick.erasing(54_000) == train.RECIPES["quick"]["erase"]
    assert quick.erasing(6000) == pytest.approx(small_erase * (20 * 150 * 128 / 6000) / 200, abs=1e-3)  # 64 passes
    assert train.TrainConfig("fashion_mnist", erase=0.3).erasing(1000) == 0.3  # as asked
    with pytest.raises(ValueError, match="`min_steps` must be an int >= 0; got -1"):
        train.TrainConfig("fashion_mnist", min_steps=-1)


def test_the_step_floor_repeats_the_data_within_each_epoch(tmp_path, capsys):
    kw = dict(limit=128, batch_size=64, epochs=2, min_steps=10, augment="flip", distill="none", jit_compile=False,
              verbose=0, tensorboard=False, model_overrides=TINY)
    config = train.train("fashion_mnist", str(tmp_path), **kw)  # 2 batches a pass, 5 steps an epoch
    assert config["steps_per_epoch"] == 5 and config["min_steps"] == 10 and config["completed"]
    assert "step floor: 2 epochs of 5 steps (10 steps, min_steps 10), 2.5 passes over the training images an " \
           "epoch; augment 'flip'" in capsys.readouterr().out
    model = keras.saving.load_model(tmp_path / "model.keras", compile=False)
    assert len((tmp_path / "history.csv").read_text().splitlines()) == 3 and model.count_params() > 0


# The keys config.json has had since runs became resumable: resumption compares them, and evaluate and verify read
# seed and val_fraction from them, so a renamed key would restart or misread the runs already on disk.
RECORD_KEYS = {"accumulation", "augment", "batch_size", "class_names", "crop_scale", "cutmix", "data", "distill",
               "drop_path", "epochs", "patch_dropout",
               "erase", "label_smoothing", "learning_rate", "limit", "micro_batches", "min_steps", "mixup", "model", "precision",
               "optimizer", "recipe", "replicas", "seed", "skipped_images", "steps_per_epoch", "strategy", "teacher_steps",
               "train_examples", "val_examples", "val_fraction", "vit", "warmup_epochs", "weight_decay", "weights"}


def test_a_finished_run_is_not_redone_and_its_config_json_keeps_its_keys(tmp_path, capsys):
    kw = dict(limit=128, batch_size=64, epochs=1, augment="none", jit_compile=False, verbose=0, tensorboard=False,
              model_overrides=TINY)
    config = train.train("fashion_mnist", str(tmp_path), **kw)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written == json.loads(json.dumps(config)) and written["completed"] and "final_val_accuracy" in written
    run_facts = {"completed", "fit_seconds_last_session"} | {key for key in written if key.startswith("final_")}
    assert set(written) - run_facts == RECORD_KEYS
    assert (written["model"], written["micro_batches"], written["replicas"], written["steps_per_epoch"]) == \
        ("vit_quick", 1, 1, 2)  # micro-batches need XLA: as used, not as asked
    assert written["learning_rate"] == pytest.approx(train.RECIPES["quick"]["base_lr"] * 64 / 512)
    saved = (tmp_path / "model.keras").stat().st_mtime_ns
    capsys.readouterr()
    assert train.train("fashion_mnist", str(tmp_path), **kw) == written
    assert "nothing to do" in capsys.readouterr().out and (tmp_path / "model.keras").stat().st_mtime_ns == saved
    assert runs.data_split(str(tmp_path / "model.keras")) == {"seed": 0, "val_fraction": 0.1}


def test_a_run_finished_before_a_setting_was_recorded_is_not_redone(tmp_path):
    record = dict(data="fashion_mnist", epochs=12, min_steps=3000, steps_per_epoch=468, augment="flip",
                  class_names=["a", "b"])
    older = {key: value for key, value in record.items() if key != "min_steps"}
    runs.write_json(str(tmp_path / "config.json"), dict(older, completed=True))
    assert runs.start_run(str(tmp_path), record)["completed"]  # the floor did not apply: the same run
    runs.write_json(str(tmp_path / "config.json"), dict(older, steps_per_epoch=7, completed=True))
    with pytest.raises(runs.RunConflict, match="steps_per_epoch: 7 -> 468"):  # it would have: another run
        runs.start_run(str(tmp_path), record)
    vit = dict(pooling="gap", locality_attention=False)  # a model argument added later, at its default
    runs.write_json(str(tmp_path / "config.json"), dict(record, vit={"pooling": "gap"}, completed=True))
    assert runs.start_run(str(tmp_path), dict(record, vit=vit))["completed"]
    runs.write_json(str(tmp_path / "config.json"), dict(record, vit={"pooling": "gap"}, completed=True))
    with pytest.raises(runs.RunConflict, match=r"\(vit.locality_attention: False -> True\)"):
        runs.start_run(str(tmp_path), dict(record, vit=dict(vit, locality_attention=True)))
    assert runs.start_run(str(tmp_path), dict(record, vit=dict(vit, locality_attention=True)), overwrite=True) is None


def test_finetune_from_a_saved_model_and_weights_that_cannot_apply(tmp_path):
    saved = train.build_model_to_train(10, 1, (28, 28), drop_path=0.2, model_overrides=dict(num_layers=2))
    saved.save(tmp_path / "base.keras")
    tuned = train.build_model_to_train(3, 1, (28, 28), weights=str(tmp_path / "base.keras"), drop_path=0.1)
    assert tuned.get_config()["num_classes"] == 3 and tuned.get_config()["drop_path"] == 0.1
    dropping = train.build_model_to_train(3, 1, (28, 28), weights=str(tmp_path / "base.keras"), patch_dropout=0.5)
    assert dropping.patch_dropout_layer.rate == 0.5 and tuned.patch_dropout_layer is None
    for source, target in zip(saved.layers, tuned.layers):
        if target.name != "head":
            assert all(np.array_equal(a, b) for a, b in zip(source.get_weights(), target.get_weights()))
        else:  # the paper's zero-initialized head
            assert not any(np.any(w) for w in target.get_weights())
    kept = train.train("fashion_mnist", str(tmp_path / "kept"), weights=str(tmp_path / "base.keras"), epochs=1,
                       limit=128, batch_size=64, augment="none", jit_compile=False, verbose=0, tensorboard=False)
    assert kept["drop_path"] == 0.2 and kept["vit"]["drop_path"] == 0.2  # not the recipe's 0.0
    for weights, model_name, overrides, message in [
            ("vit.npz", None, None, "pass `model_name`"),
            (str(tmp_path / "base.keras"), None, dict(num_layers=2), "its own architecture"),
            (str(tmp_path / "base.keras"), "vit_ti16", None, "its own architecture")]:
        with pytest.raises(ValueError, match=message):
            train.train("fashion_mnist", str(tmp_path / "run"), model_name=model_name, weights=weights,
                        model_overrides=overrides, verbose=0)
    assert not (tmp_path / "run").exists()


def run_cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "vit_keras.apps.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_rerun_resumes_to_the_full_epoch_count(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--data", "fashion_mnist", "--limit", "1024", "--epochs", "3", "--batch-size", "32", "--out",
            str(out), "--no-jit", "--quiet", *TINY_ARGS]
    process = subprocess.Popen([sys.executable, "-m", "vit_keras.apps.cli", *args], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    history, deadline = out / "history.csv", time.time() + 400
    while time.time() < deadline and process.poll() is None:  # wait for epoch 1 to finish, then kill in epoch 2
        if history.exists() and len(history.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    assert process.poll() is None, "training ended before it could be interrupted"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "model.keras").exists()
    capsys.readouterr()
    assert cli.main(args) == 0  # the rerun, in this process (a process start costs ~10 CPU s)
    rerun = capsys.readouterr().out
    assert "Epoch 1/3" not in rerun and "Epoch 3/3" in rerun  # resumed, epoch 1 not redone
    rows = history.read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"]
    config = json.loads((out / "config.json").read_text())
    assert config["completed"] and config["epochs"] == 3
    assert (out / "labels.txt").read_text().splitlines()[0] == "T-shirt/top"
    model = keras.saving.load_model(out / "model.keras", compile=False)
    assert model.input_shape == (None, 32, 32, 1) and model.get_config()["include_preprocessing"]
    # evaluate: a per-class table and a confusion-matrix PNG
    confusion = tmp_path / "c.png"
    assert cli.main(["evaluate", str(out / "model.keras"), "--limit", "300", "--confusion", str(confusion)]) == 0
    evaluated = capsys.readouterr().out
    assert "accuracy" in evaluated and "Ankle boot" in evaluated
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert list((out / "logs").rglob("events.out.tfevents*")), "no TensorBoard logs"


@pytest.mark.slow
def test_a_folder_of_photos_trains_and_ships_with_its_folder_names(fashion, tmp_path):
    """folder:PATH end to end: JPEGs of another size and a corrupt file train; labels.txt, the int8 file's
    metadata and the app's answers carry the sub-folder names."""
    from PIL import Image

    from vit_keras.apps.classifier import Classifier
    from vit_keras.convert.metadata import read_labels

    images, labels, names = fashion
    classes = {0: "t-shirt", 1: "trouser", 8: "bag"}
    for label, name in classes.items():
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i, index in enumerate(np.flatnonzero(labels == label)[:45]):
            Image.fromarray(images[index, ..., 0]).convert("RGB").resize((40, 40)).save(
                tmp_path / "photos" / name / f"{i}.jpg", quality=95)
    (tmp_path / "photos" / "bag" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    out, data = tmp_path / "run", f"folder:{tmp_path / 'photos'}"
    assert cli.main(["train", "--data", data, "--epochs", "2", "--batch-size", "16", "--out", str(out), "--no-jit",
                     "--quiet", *TINY_ARGS]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["skipped_images"] == 1 and config["vit"]["image_size"] == [64, 64]  # 40 px -> the quick 64
    assert (out / "labels.txt").read_text().splitlines() == sorted(classes.values())
    assert cli.main(["export", str(out / "model.keras"), "--calibration", data, "--calibration-size", "100",
                     "--out", str(tmp_path / "photos.tflite")]) == 0
    assert read_labels(str(tmp_path / "photos.tflite")) == sorted(classes.values())
    top = Classifier(tmp_path / "photos.tflite").classify(tmp_path / "photos" / "trouser" / "0.jpg").top
    assert {label for label, _ in top} == set(classes.values())


def test_strategy_choice_and_the_quick_recipes_sizes():
    assert train.get_strategy("auto") is tf.distribute.get_strategy()  # no TPU, no GPUs here
    with pytest.raises(ValueError, match="needs the TF_CONFIG"):
        train.get_strategy("multi_worker")
    with pytest.raises(ValueError, match="valid values are 'auto', 'default'"):
        train.get_strategy("horovod")
    sizes = {side: train.recipe_image_size((side, side)) for side in (8, 28, 32, 40, 96)}  # a 4x4 grid
    assert sizes == {8: ((32, 32), 8), 28: ((32, 32), 8), 32: ((32, 32), 8), 40: ((64, 64), 16), 96: ((64, 64), 16)}
    assert sizes == {side: train.recipe_image_size((side, side), "long") for side in sizes}  # the same grid
    finer = {side: train.recipe_patch(side, (7, 8)) for side in (28, 32, 64)}  # a 7x7 or 8x8 grid
    assert finer == {28: 4, 32: 4, 64: 8}
    odd = {side: train.build_model_to_train(10, 1, (28, 28), image_size=side).get_config()["patch_size"] for side in (21, 30)}
    assert odd == {21: 3, 30: 6}  # the largest whole patch near the recipe's grid: 7x7 and 5x5
    asked = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=dict(patch_size=4)).get_config()
    assert (asked["patch_size"], asked["stem"]) == (4, "conv")  # the stem follows the patch asked for


@pytest.mark.parametrize("pooling, class_token", [("token", True), ("sequence", False), ("gap", False)])
def test_a_pooling_override_brings_the_class_token_its_readout_needs(pooling, class_token):
    model = train.build_model_to_train(10, 1, (28, 28), model_overrides=dict(pooling=pooling))
    assert model.vit_config["pooling"] == pooling and model.vit_config["class_token"] is class_token
    kept = train.build_model_to_train(10, 1, (28, 28), model_overrides=dict(pooling="sequence", class_token=True))
    assert kept.vit_config["class_token"] is True


MIRRORED = """
import sys, json, numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from vit_keras.training import train
# Adam moves a weight whose gradient is ~0 by up to the LR per step whatever its rounding: a fixed, small LR
# keeps the tolerance below independent of the recipe's.
kw = dict(limit=256, epochs=1, batch_size=64, learning_rate=1e-3, augment="none", jit_compile=False, verbose=0,
          tensorboard=False, model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
weights = {}
for strategy in ("default", "mirrored"):
    config = train.train("fashion_mnist", sys.argv[1] + "/" + strategy, strategy=strategy, **kw)
    model = keras.saving.load_model(sys.argv[1] + "/" + strategy + "/model.keras", compile=False)
    weights[strategy] = (config["replicas"], model.get_weights())
gap = max(float(np.abs(a - b).max()) for a, b in zip(weights["default"][1], weights["mirrored"][1]))
print(json.dumps(dict(replicas=weights["mirrored"][0], gap=gap)))
"""


@pytest.mark.slow
def test_mirrored_strategy_over_two_logical_cpus_matches_one_device(tmp_path):
    result = subprocess.run([sys.executable, "-c", MIRRORED, str(tmp_path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    # Adam moves each weight by at most about the LR (1e-3) a step, so two runs whose near-zero gradients round
    # apart can differ by twice that over the 4 steps; the class-balanced 256-image sample measured 5.0e-3.
    assert figures["replicas"] == 2 and figures["gap"] < 8e-3, figures


MIRRORED_SGD = """
import sys, json, numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from vit_keras.training import train
# Adam is blind to the gradient's scale; SGD is not, so it also checks that the replicas' gradients are averaged
# over the global batch (a sum would double every step). A plain patch embedding: no BatchNorm here.
from vit_keras.data.datasets import load_dataset
from vit_keras.data.pipeline import make_dataset
data = load_dataset("fashion_mnist", "train", limit=256)
plain = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, stem=None)
sgd = {}
for strategy in ("default", "mirrored"):
    with train.get_strategy(strategy).scope():
        model = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain)
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True), jit_compile=False)
    model.fit(make_dataset(data.images, data.labels, 10, batch_size=64), epochs=1, verbose=0)  # 4 fixed batches
    sgd[strategy] = model.get_weights()
sgd_gap = max(float(np.abs(a - b).max()) for a, b in zip(sgd["default"], sgd["mirrored"]))
sgd_step = max(float(np.abs(a - b).max()) for a, b in
               zip(sgd["default"], train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain).get_weights()))
print(json.dumps(dict(sgd_gap=sgd_gap, sgd_step=sgd_step)))
"""


@pytest.mark.slow
def test_mirrored_strategy_averages_gradients_over_the_global_batch():
    # A fresh process: two MirroredStrategy objects in one process collide on collective instance keys.
    result = subprocess.run([sys.executable, "-c", MIRRORED_SGD], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["sgd_gap"] < 1e-4 and figures["sgd_step"] > 1e-2, figures  # the same steps, and real ones


MULTI_WORKER_SGD = """
import sys, numpy as np, keras
from vit_keras.training import building, train
from vit_keras.data.datasets import load_dataset
from vit_keras.data.pipeline import make_dataset
# SGD, unlike Adam, is linear in the gradient: workers that never synced, or summed their gradients instead of
# averaging them over the global batch, end far from one worker's weights.
strategy = train.get_strategy(sys.argv[2])
data = load_dataset("fashion_mnist", "train", limit=256)
plain = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, stem=None)  # no BatchNorm
with strategy.scope():
    model = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    if sys.argv[2] == "multi_worker":
        building.prebuild_multi_worker(model, 64, 10)
model.fit(make_dataset(data.images, data.labels, 10, batch_size=64), epochs=1, verbose=0)  # 4 fixed batches
start = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain).get_weights()
np.savez(sys.argv[1], *model.get_weights(), step=max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), start)))
"""


def run_workers(commands, log_dir, timeout=600):
    """One MultiWorkerMirroredStrategy worker process per command (argv lists), on 127.0.0.1, each logging to a
    file in ``log_dir``; checks that they all succeeded, showing each failed worker's own log (a worker that dies
    makes its peer fail with "tasks are unhealthy", which says nothing of why). Files, not pipes: no worker can
    block on a pipe nobody reads while the test waits on its peer."""
    sockets = [socket.socket() for _ in commands]
    for s in sockets:  # hold every port until all are chosen, so no two are the same
        s.bind(("127.0.0.1", 0))
    workers = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    processes = []
    for index, command in enumerate(commands):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        with open(log_dir / f"worker{index}.log", "w") as log:
            processes.append(subprocess.Popen(command, cwd=ROOT, env={**os.environ, "TF_CONFIG": tf_config},
                                              stdout=log, stderr=subprocess.STDOUT))
    try:
        for process in processes:
            process.wait(timeout=timeout)
    finally:
        for process in processes:  # a hung peer must not outlive the test
            process.kill()
    failed = [index for index, process in enumerate(processes) if process.returncode != 0]
    assert not failed, "\n".join(f"worker {index}:\n" + (log_dir / f"worker{index}.log").read_text()[-3000:]
                                  for index in failed)


@pytest.mark.slow
def test_multi_worker_sgd_steps_equal_one_workers(tmp_path):
    one = subprocess.run([sys.executable, "-c", MULTI_WORKER_SGD, str(tmp_path / "one.npz"), "default"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    with np.load(tmp_path / "one.npz") as reference:
        expected, step = [reference[f"arr_{i}"] for i in range(len(reference.files) - 1)], float(reference["step"])
    paths = [str(tmp_path / f"worker{index}.npz") for index in range(2)]
    run_workers([[sys.executable, "-c", MULTI_WORKER_SGD, path, "multi_worker"] for path in paths], tmp_path)
    for path in paths:
        with np.load(path) as worker:
            gap = max(float(np.abs(worker[f"arr_{i}"] - w).max()) for i, w in enumerate(expected))
        assert gap < 1e-4 and step > 1e-2, (gap, step)  # the same steps, and real ones


@pytest.mark.slow
def test_multi_worker_mirrored_two_processes_match_one_worker(tmp_path):
    args = ["train", "--data", "fashion_mnist", "--limit", "256", "--epochs", "1", "--batch-size", "64", "--lr", "1e-3",
            "--augment", "none", "--no-jit", "--quiet", *TINY_ARGS]  # a fixed LR, as in MIRRORED
    assert cli.main([*args, "--strategy", "default", "--out", str(tmp_path / "one")]) == 0
    run_workers([[sys.executable, "-m", "vit_keras.apps.cli", *args, "--strategy", "multi_worker", "--out",
                  str(tmp_path / "two")]] * 2, tmp_path)
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["replicas"] == 2
    a = keras.saving.load_model(tmp_path / "one" / "model.keras", compile=False).get_weights()
    b = keras.saving.load_model(tmp_path / "two" / "model.keras", compile=False).get_weights()
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) < 5e-3


@pytest.mark.parametrize("argv,message", [
    (["train", "--out", "X", "--data", "folder:/no/such/folder"], "does not exist"),
    (["train", "--out", "X", "--epochs", "0"], "--epochs must be a positive integer"),
    (["train", "--out", "X", "--steps-per-execution", "0"], "--steps-per-execution must be a positive integer"),
    (["train", "--out", "X", "--model", "vit_q99"], "--model 'vit_q99' is unknown"),
    (["train", "--out", "X", "--crop-scale", "1.5"], "--crop-scale must be in (0, 1]"),
    (["train", "--out", "X", "--data", "imagenet"], "--data must be"),
    (["train", "--out", "X", "--weights", "/no/such.keras"], "does not exist"),
    (["evaluate", "/no/such/model.keras"], "does not exist"),
])
def test_cli_bad_input_gives_clean_errors(argv, message, capsys, tmp_path):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--lr", "0", "--lr must be > 0"), ("--warmup-epochs", "-1", "--warmup-epochs must be >= 0"),
    ("--label-smoothing", "1", "--label-smoothing must be in [0, 1)"), ("--drop-path", "-0.1", "--drop-path"),
    ("--teacher-steps", "0", "--teacher-steps must be a positive integer; got 0."),
    ("--erase", "-0.1", "--erase must be in [0, 1]; got -0.1."),
])
def test_cli_rejects_bad_hyper_parameters_before_loading(flag, value, message, capsys, tmp_path):
    assert cli.main(["train", "--out", str(tmp_path / "o"), flag, value]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_cli_one_class_folder_and_bad_image_size(capsys, tmp_path):
    from PIL import Image

    (tmp_path / "only").mkdir()
    Image.new("L", (28, 28)).save(tmp_path / "only" / "a.png")
    assert cli.main(["train", "--out", str(tmp_path / "o"), "--data", f"folder:{tmp_path}"]) == 2
    assert "only one class" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    for i in range(3):
        Image.new("L", (28, 28), 255).save(tmp_path / "other" / f"{i}.png")
        Image.new("L", (28, 28), 0).save(tmp_path / "only" / f"{i}.png")
    assert cli.main(["train", "--out", str(tmp_path / "o"), "--data", f"folder:{tmp_path}", "--image-size", "30",
                     "--patch-size", "4", "--val-fraction", "0.3"]) == 2
    assert "`image_size`=(30, 30) is not divisible by the 'conv' stem's stride 4" in capsys.readouterr().err


def test_fit_prints_one_line_an_epoch_when_not_on_a_terminal():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert train.fit_verbosity("auto", io.StringIO()) == 2  # a log file: one line an epoch
    assert train.fit_verbosity("auto", Terminal()) == 1  # a terminal: the progress bar
    assert train.fit_verbosity(0, Terminal()) == 0 and train.fit_verbosity(1, io.StringIO()) == 1  # asked: kept
