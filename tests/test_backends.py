"""The model library on every Keras backend: the same checkpoints give the same logits under TensorFlow, JAX and
PyTorch, without TensorFlow imported under the other two, and a .keras file saved under one loads under the others.

Each backend runs tests/backend_worker.py in its own process (Keras picks its backend once per process).
"""

import functools
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("tensorflow", "jax", "torch")
TOLERANCE = 1e-5  # float32, against TensorFlow's
# The hybrid's 26-layer ResNet stem: every backend, and timm's PyTorch reference, land 2.0-2.3e-5 from each other
# (float32 accumulation order in the convolutions), so the stem's own noise sets this bound.
HYBRID_TOLERANCE = 5e-5
REFERENCE_TOLERANCE = 1e-4  # against timm / Hugging Face, as tests/test_weights.py

missing = [b for b in BACKENDS if importlib.util.find_spec(b) is None]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing), reason=f"backend packages not installed: {missing}")]


def run_workers(out_dir, jobs):
    """Run tests/backend_worker.py once for each (backend, args) of ``jobs``, all at once, each in its own process."""
    running = []
    for i, (backend, args) in enumerate(jobs):
        env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}
        log = open(os.path.join(out_dir, f"worker_{backend}_{i}_{len(args)}.log"), "w+")  # a pipe could fill up
        running.append((backend, log, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "backend_worker.py"), str(out_dir), *args], env=env,
            stdout=subprocess.DEVNULL, stderr=log)))
    for backend, log, process in running:
        process.wait(timeout=900)
        log.seek(0)
        stderr = log.read()
        log.close()
        assert process.returncode == 0, f"{backend} worker failed:\n{stderr[-4000:]}"


@functools.lru_cache(maxsize=1)
def results(out_dir):
    """Every backend's results. The three workers run at once: each runs the cases and saves its .keras file,
    then loads the other two backends' files as they appear."""
    others = {backend: [os.path.join(out_dir, f"{b}.keras") for b in BACKENDS if b != backend] for backend in BACKENDS}
    run_workers(out_dir, [(backend, ["--load", *others[backend]]) for backend in BACKENDS])
    loaded = {}
    for name in BACKENDS:
        with np.load(os.path.join(out_dir, f"{name}.npz")) as data:
            loaded[name] = {k: data[k] for k in data.files}
    return loaded


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    return results(str(tmp_path_factory.mktemp("backends")))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_checkpoints_give_tensorflows_logits(computed, backend):
    reference, other = computed["tensorflow"], computed[backend]
    cases = [k for k in reference if k.startswith("logits/")]
    assert len(cases) == 7
    for key in cases:
        diff = float(np.abs(other[key] - reference[key]).max())
        bound = HYBRID_TOLERANCE if "hybrid" in key else TOLERANCE
        assert diff <= bound, f"{backend} {key}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoints_match_the_reference_implementations(computed, backend):
    import weight_checkpoints as wc

    with np.load(os.path.join(os.path.dirname(HERE), wc.FIXTURES, "expected.npz")) as expected:
        for key, logits in computed[backend].items():
            if not key.startswith("logits/"):
                continue
            case = key.split("/", 1)[1]
            diff = float(np.abs(logits - expected[f"{case}/logits"]).max())
            assert diff <= REFERENCE_TOLERANCE, f"{backend} {case}: {diff:.2e} from the reference"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_attention_resize_and_heatmap_agree(computed, backend):
    reference, other = computed["tensorflow"], computed[backend]
    keys = [k for k in reference if k.startswith("attention/")] + ["heatmap", "resized"]
    assert len(keys) == 5  # three blocks' maps, the heatmap, the resized model's logits
    for key in keys:
        assert other[key].shape == reference[key].shape, key
        diff = float(np.abs(other[key] - reference[key]).max())
        assert diff <= TOLERANCE, f"{backend} {key}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_predict_gives_tensorflows_outputs(computed, backend):
    """``vit_keras.predict``: TensorFlow's concurrent micro-batches; the other backends' predict step, per batch."""
    reference, other = computed["tensorflow"]["predict"], computed[backend]["predict"]
    assert other.shape == reference.shape == (3, 7)
    diff = float(np.abs(other - reference).max())
    assert diff <= TOLERANCE, f"{backend} predict: max abs diff {diff:.2e}"


def test_keras_files_load_across_backends(computed):
    reference = computed["jax"]["loaded/tensorflow"]
    assert np.abs(reference).max() > 0
    pairs = [(reader, writer) for reader in BACKENDS for writer in BACKENDS if reader != writer]
    for reader, writer in pairs:  # every backend reads the other two's files
        diff = float(np.abs(computed[reader][f"loaded/{writer}"] - reference).max())
        assert diff <= TOLERANCE, f"{writer}.keras read under {reader}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_tensorflow_is_not_imported(computed, backend):
    modules = set(computed[backend]["modules"].tolist())
    assert "tensorflow" not in modules, modules
