"""Training under Keras's JAX backend: the CLI's run folder, DataParallel over two devices, resumption after a
SIGKILL, the NaN stop, mixed precision, the backend's strategy choices, a JAX-trained model's TFLite export; a
PyTorch run; and the NumPy input pipeline (vit_keras.data.array_pipeline) against the tf.data one.

Keras picks its backend once per process, so each JAX part runs in a subprocess with KERAS_BACKEND=jax; the
pipeline comparisons and the export run here, under TensorFlow.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import vit_keras
from vit_keras.data import array_pipeline
from vit_keras.data import pipeline
from vit_keras.data.augmentation import Augmentation
from vit_keras.apps import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = ["--hidden-size", "32", "--num-heads", "2", "--mlp-dim", "64", "--num-layers", "1"]
JAX = {"KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")


def run_cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "vit_keras.apps.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **JAX, **(env or {})}, timeout=timeout)


def run_script(script, *args, env=None, timeout=600):
    """A Python script under JAX; returns the JSON its last line prints."""
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, **JAX, **(env or {})}, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_jax
@pytest.mark.slow
def test_a_jax_run_writes_the_run_folder_and_its_model_exports_to_tflite(tmp_path, fashion_test):
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.runtime import tflite_scores
    from vit_keras.cpu import cpu_features
    from vit_keras.training.optimizer import fast_precision

    out = tmp_path / "run"
    trained = run_cli("train", "--data", "fashion_mnist", "--limit", "384", "--epochs", "2", "--batch-size", "64",
                      "--precision", "mixed_bfloat16", "--out", str(out), "--quiet", *TINY_ARGS)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Epoch 2/2" in trained.stdout and "val accuracy" in trained.stdout
    assert {"model.keras", "checkpoint.keras", "config.json", "history.csv", "labels.txt", "logs"} <= \
        set(os.listdir(out)) and not (out / "backup").exists()  # as under TensorFlow; the backup goes at the end
    config = json.loads((out / "config.json").read_text())
    assert config["completed"] and (config["replicas"], config["micro_batches"]) == (1, 1)  # one program a step
    # mixed_bfloat16 where the CPU has bf16 units; elsewhere (AVX2) the run says so and trains in float32
    expected, why = fast_precision("mixed_bfloat16", cpu_features(), accelerators=0)
    assert config["precision"] == expected and "final_val_accuracy" in config
    assert why is None or "no bfloat16 units" in trained.stdout + trained.stderr
    assert [row.split(",")[0] for row in (out / "history.csv").read_text().splitlines()[1:]] == ["0", "1"]
    model = vit_keras.load_model(str(out / "model.keras"))  # saved under JAX, read under TensorFlow

    assert cli.main(["export", str(out / "model.keras"), "--calibration", "fashion_mnist", "--calibration-size",
                     "100", "--out", str(tmp_path / "int8.tflite")]) == 0  # here, under TensorFlow
    for mode in ("float32", "float16", "dynamic"):
        export_tflite(str(out / "model.keras"), str(tmp_path / f"{mode}.tflite"), quantize=mode)
    images = pipeline.fit_images(fashion_test[0][:16], model.input_shape[1:3], 1)  # 28x28 -> the model's 32x32
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model(images.astype("float32"))))
    for mode in ("float32", "float16", "dynamic", "int8"):
        scores = tflite_scores(str(tmp_path / f"{mode}.tflite"), images)
        assert scores.shape == (16, 10), mode
        agreement = np.mean(scores.argmax(1) == expected.argmax(1))
        assert agreement >= (0.99 if mode == "float32" else 0.8), (mode, agreement)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_torch_run_writes_the_same_run_folder(tmp_path):
    """Keras's torch trainer: one device, eager, one step per execution; crops from the NumPy pipeline."""
    out = tmp_path / "run"
    trained = run_cli("train", "--data", "fashion_mnist", "--limit", "192", "--epochs", "1", "--batch-size", "64",
                      "--augment", "crop", "--out", str(out), "--quiet", *TINY_ARGS, env={"KERAS_BACKEND": "torch"})
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert {"model.keras", "checkpoint.keras", "config.json", "history.csv", "labels.txt"} <= set(os.listdir(out))
    config = json.loads((out / "config.json").read_text())
    assert config["completed"] and config["steps_per_epoch"] == 3 and np.isfinite(config["final_val_loss"])
    assert vit_keras.load_model(str(out / "model.keras")).input_shape == (None, 32, 32, 1)


@needs_jax
@pytest.mark.slow
def test_sigkill_mid_epoch_then_rerun_resumes_under_jax(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--data", "fashion_mnist", "--limit", "2048", "--epochs", "3", "--batch-size", "32", "--out",
            str(out), "--quiet", "--steps-per-execution", "1", *TINY_ARGS]
    command = [sys.executable, "-m", "vit_keras.apps.cli", *args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, **JAX})
    history, backup, deadline = out / "history.csv", out / "backup", time.time() + 400
    while time.time() < deadline and process.poll() is None:  # wait for epoch 1's backup, then kill in epoch 2
        if history.exists() and len(history.read_text().splitlines()) >= 2 and backup.is_dir() and \
                any(name.startswith("state-") for name in os.listdir(backup)):
            break
        time.sleep(0.05)
    time.sleep(0.1)
    assert process.poll() is None, "training ended before it could be interrupted"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "model.keras").exists() and (out / "backup").is_dir()
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Epoch 1/3" not in rerun.stdout and "Epoch 3/3" in rerun.stdout  # resumed, epoch 1 not redone
    assert [r.split(",")[0] for r in history.read_text().splitlines()[1:]] == ["0", "1", "2"]
    assert json.loads((out / "config.json").read_text())["completed"]


DATA_PARALLEL = """
import json, sys
import jax, keras, numpy as np
from vit_keras.training import strategies
from vit_keras.training import train
from vit_keras.data.array_pipeline import make_batches
from vit_keras.data.datasets import load_dataset
# SGD, unlike Adam, is linear in the gradient: devices that summed their gradients instead of averaging them over
# the global batch, or never combined them, end far from one device's weights. No BatchNorm (a plain patch embedding).
data = load_dataset("fashion_mnist", "train", limit=256)
plain = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, stem=None)
sgd, replicas = {}, {}
for name in ("default", "data_parallel"):
    dist = train.get_strategy(name)
    replicas[name] = strategies.replica_count(dist)
    with strategies.scope(dist):
        model = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    with strategies.fit_scope(dist):
        model.fit(make_batches(data.images, data.labels, 10, batch_size=64), epochs=1, verbose=0)  # 4 fixed batches
    sgd[name] = model.get_weights()
start = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=plain).get_weights()
gap = max(float(np.abs(a - b).max()) for a, b in zip(sgd["default"], sgd["data_parallel"]))
step = max(float(np.abs(a - b).max()) for a, b in zip(sgd["default"], start))
# The trainer over both devices: the recipe's model (conv stem, BatchNorm) and AdamW; 203 validation images end
# in a batch of 11 that two devices cannot split evenly.
config = train.train("fashion_mnist", sys.argv[1], strategy="data_parallel", limit=203, epochs=1, batch_size=64,
                     augment="none", verbose=0, tensorboard=False,
                     model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
print(json.dumps(dict(devices=len(jax.devices()), replicas=replicas, gap=gap, step=step,
                      train_replicas=config["replicas"], completed=config["completed"],
                      val_loss=config["final_val_loss"], auto=strategies.replica_count(train.get_strategy()))))
"""


@needs_jax
@pytest.mark.slow
def test_data_parallel_over_two_devices_matches_one_device(tmp_path):
    figures = run_script(DATA_PARALLEL, tmp_path, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert figures["devices"] == 2 and figures["replicas"] == {"default": 1, "data_parallel": 2}, figures
    assert figures["auto"] == 2 and figures["train_replicas"] == 2, figures  # auto spreads over every device
    assert figures["gap"] < 1e-4 and figures["step"] > 1e-2, figures  # the same steps, and real ones
    assert figures["completed"] and np.isfinite(figures["val_loss"]), figures


NAN_STOP = """
import json, sys
import keras, numpy as np
from vit_keras import VisionTransformer
from vit_keras.training import runs
from vit_keras.training import train
from vit_keras.data.array_pipeline import make_batches
from vit_keras.data.augmentation import Augmentation
from vit_keras.data.datasets import load_dataset

data = load_dataset("fashion_mnist", "train", limit=256)
keras.utils.set_random_seed(0)
model = VisionTransformer(image_size=28, patch_size=7, channels=1, num_classes=10, hidden_size=32, num_heads=2,
                          mlp_dim=64, num_layers=1, pooling="gap", class_token=False, include_preprocessing=True)
steps = 256 // 64
# A sane LR for epoch 1, then one large enough to overflow the logits in epoch 2.
schedule = keras.optimizers.schedules.PiecewiseConstantDecay([steps], [1e-3, 1e30])
train.compile_model(model, schedule, clipnorm=None)
callbacks = runs.make_callbacks(sys.argv[1], 64, tensorboard=False)
try:
    model.fit(make_batches(data.images, data.labels, 10, batch_size=64, training=True,
                           augmentation=Augmentation("none")), epochs=3,
              callbacks=callbacks, verbose=0)
    stopped = ""
except train.NonFiniteLoss as error:
    stopped = str(error)
good = keras.saving.load_model(sys.argv[1] + "/checkpoint.keras", compile=False)
try:
    train.train("fashion_mnist", sys.argv[1] + "/refused", strategy="multi_worker")
    refused = ""
except ValueError as error:
    refused = str(error)
# Mixed precision under JAX: blocks in the low precision, LayerNorm statistics and logits in float32; float16
# trains, with loss scaling (the CLI test trains in mixed_bfloat16).
precisions = {}
for precision in ("mixed_bfloat16", "mixed_float16"):
    train.set_precision(precision)
    keras.utils.set_random_seed(0)
    mixed = train.build_model_to_train(10, 1, (28, 28), image_size=28, model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
    train.compile_model(mixed, 1e-3, precision)
    block = mixed.get_layer("encoderblock_0")
    wide = keras.ops.cast(np.tile([300.0, -300.0], (1, 4, 16)), block.compute_dtype)
    x, y = data.images[:64].astype("float32"), np.eye(10, dtype="float32")[data.labels[:64]]
    losses = [float(mixed.train_on_batch(x, y, return_dict=True)["loss"])
              for _ in range(3 if precision == "mixed_float16" else 0)]
    precisions[precision] = dict(block=block.compute_dtype, head=mixed.get_layer("head").compute_dtype,
                                 logits=str(mixed(x[:2]).dtype), losses=losses,
                                 norm_finite=bool(np.isfinite(keras.ops.convert_to_numpy(
                                     keras.ops.cast(block.norm1(wide), "float32"))).all()),
                                 loss_scaled=isinstance(mixed.optimizer, keras.optimizers.LossScaleOptimizer))
train.set_precision("float32")
print(json.dumps(dict(stopped=stopped, finite=all(bool(np.isfinite(w).all()) for w in good.get_weights()),
                      refused=refused, precisions=precisions)))
"""


@needs_jax
@pytest.mark.slow
def test_a_nan_under_jax_stops_keeping_the_last_good_checkpoint_and_mixed_precision_keeps_float32_parts(tmp_path):
    figures = run_script(NAN_STOP, tmp_path)
    assert "epoch 2" in figures["stopped"] and "last good checkpoint is kept" in figures["stopped"], figures
    assert figures["finite"] and not (tmp_path / "model.keras").exists()
    assert "Unknown `strategy`='multi_worker'; valid values are 'auto', 'default', 'data_parallel' under the jax" \
        in figures["refused"] and not (tmp_path / "refused").exists()
    for precision, low in (("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")):
        got = figures["precisions"][precision]
        assert (got["block"], got["head"], got["logits"]) == (low, "float32", "float32"), (precision, got)
        assert got["norm_finite"] and got["loss_scaled"] == (precision == "mixed_float16"), got
    losses = figures["precisions"]["mixed_float16"]["losses"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses  # XLA compiles float16 attention


@pytest.mark.parametrize("backend, argv, message", [
    ("jax", ["--strategy", "multi_worker"],
     "Unknown --strategy='multi_worker'; valid values are 'auto', 'default', 'data_parallel' under the jax backend"),
    ("torch", ["--strategy", "data_parallel"], "valid values are 'auto', 'default' under the torch backend"),
    ("mxnet", [], "KERAS_BACKEND='mxnet' is not a backend vit-keras trains on; valid values are 'tensorflow', 'jax'"),
])
def test_the_backends_strategies_are_checked_before_data_loads(backend, argv, message, tmp_path):
    result = run_cli("train", "--out", str(tmp_path / "run"), *argv, env={"KERAS_BACKEND": backend})
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_backend_whose_package_is_missing_says_how_to_install_it(tmp_path):
    # The package made unimportable in that process (as if not installed): import and find_spec both fail.
    script = ("import sys; sys.modules['jax'] = None; from vit_keras.apps import cli; "
              f"sys.exit(cli.main(['train', '--out', {str(tmp_path / 'run')!r}]))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KERAS_BACKEND": "jax", "VIT_KERAS_TCMALLOC": "0"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "KERAS_BACKEND='jax' needs the jax package, which is not installed: pip install 'jax[cpu]'" in result.stderr
    assert not (tmp_path / "run").exists()


# ----- the NumPy input pipeline against the tf.data one (here, under TensorFlow) -----

@pytest.mark.parametrize("shape, size, channels", [((3, 28, 28, 1), (64, 64), 3), ((3, 40, 30, 3), (28, 28), 1),
                                                   ((2, 13, 17, 1), (28, 5), 1), ((2, 32, 32, 3), (32, 32), 3)])
def test_fitting_a_batch_to_the_model_gives_tensorflows_pixels(shape, size, channels):
    x = np.random.default_rng(0).uniform(0, 255, shape).astype("float32")
    expected = pipeline.fit_batch(tf.constant(x), size, channels).numpy()
    got = array_pipeline.fit_batch(x, size, channels)
    assert got.shape == expected.shape and float(np.abs(got - expected).max()) < 2e-3


def test_random_resized_crops_sample_where_the_tf_data_crops_do():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 255, (4, 28, 28, 1)).astype("float32")
    whole = array_pipeline.random_resized_crop(x, (28, 28), (1, 1), rng, ratio=(1, 1))
    np.testing.assert_array_equal(whole, x)  # the whole image at its own size is the identity
    # A box as random_resized_crop draws it, through tf.image.crop_and_resize as pipeline.random_resized_crop does
    # (the corners on the first/last output pixels' centres, a 1-pixel repeated border).
    top, left, h, w = np.array([0.1, 0.0, 0.3, 0.6]), np.array([0.2, 0.1, 0.0, 0.0]), np.array([0.5, 1, 0.7, 0.4]), \
        np.array([0.6, 0.9, 0.4, 1.0])
    for size in ((28, 28), (64, 48), (7, 9)):
        got = array_pipeline.separable(x, array_pipeline.interpolation_weights(top, h, 28, size[0]),
                                       array_pipeline.interpolation_weights(left, w, 28, size[1]))

        def corners(start, extent, out):
            first, last = start + 0.5 * extent / out, start + extent - 0.5 * extent / out
            return [(first * 28 + 0.5) / 29, (last * 28 + 0.5) / 29]

        (y1, y2), (x1, x2) = corners(top, h, size[0]), corners(left, w, size[1])
        boxes = np.stack([y1, x1, y2, x2], 1).astype("float32")
        bordered = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="SYMMETRIC")
        expected = tf.image.crop_and_resize(bordered, boxes, tf.range(4), size).numpy()
        assert float(np.abs(got - expected).max()) < 2e-3, size


def test_numpy_batches_are_deterministic_given_the_seed_and_differ_by_epoch(fashion_train):
    images, labels = fashion_train[0][:96], fashion_train[1][:96]
    options = dict(num_classes=10, batch_size=8, training=True, image_size=32, channels=3, workers=1,
                   augmentation=Augmentation("randaugment", mixup=0.2, cutmix=1.0))
    first, again = (array_pipeline.make_batches(images[:24], labels[:24], seed=3, **options) for _ in range(2))
    reversed_order = [again[i] for i in reversed(range(len(again)))][::-1]  # made in another order
    for (x, y), (x2, y2) in zip([first[i] for i in range(len(first))], reversed_order):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    x, y = first[0]
    assert x.shape == (8, 32, 32, 3) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 255
    np.testing.assert_allclose(y.sum(1), 1, rtol=1e-5)  # mixed one-hot labels
    first.on_epoch_end()
    assert not np.array_equal(first[0][0], x)  # the next epoch: another shuffle and other draws
    other = array_pipeline.make_batches(images, labels, seed=4, **options)
    assert not np.array_equal(other[0][0], x)
    plain = array_pipeline.make_batches(images, labels, 10, batch_size=40)  # evaluation: in order, the last batch short
    assert [len(plain[i][0]) for i in range(len(plain))] == [40, 40, 16]
    np.testing.assert_array_equal(plain[0][0], images[:40].astype("float32"))
    halves = [array_pipeline.make_batches(images, labels, 10, batch_size=32, shard=(i, 2))[1][0] for i in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves), images[32:64].astype("float32"))  # each process its rows
    floor = array_pipeline.make_batches(images, labels, 10, batch_size=32, training=True,
                                        augmentation=Augmentation("none"),
                                        batches_per_epoch=7)  # the step floor: 3 batches a pass, repeated
    assert len(floor) == 7
    rows = [floor[i][0] for i in range(7)]
    passes = [np.concatenate(rows[i:i + 3]) for i in (0, 3)]
    assert sorted(map(bytes, passes[0])) == sorted(map(bytes, passes[1]))  # each pass sees every image once
    assert not np.array_equal(passes[0], passes[1])  # in its own order
    with pytest.raises(ValueError, match="`crop_scale` must be"):
        array_pipeline.make_batches(images, labels, 10, augmentation=Augmentation(crop_scale=(0.9, 0.5)))
    with pytest.raises(ValueError, match="Unknown `augment`='rotate'"):
        array_pipeline.make_batches(images, labels, 10, augmentation=Augmentation("rotate"))
