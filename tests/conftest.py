"""Fixtures shared by several test files: Fashion-MNIST arrays and the app's tiny exported ViTs.

Fashion-MNIST is read by the library's own loader (``vit_keras.data.datasets``); ``test_data.py`` tests that reader against
hand-written IDX files, so the other tests need no reader of their own. Plain helpers that are not fixtures live in
ordinary modules (``app_models.py``, ``weight_checkpoints.py``): a conftest is not reliably importable by name.
"""

import os

import pytest

from app_models import shared_models
from vit_keras.apps.allocator import tcmalloc_environment, tcmalloc_loaded
from vit_keras.data.datasets import load_arrays


def pytest_configure(config):
    """xdist's workers, started after this, and every process the tests start run under tcmalloc, as the CLI runs
    itself (apps/allocator.py): under glibc's malloc each XLA step faults its buffers in afresh."""
    env = None if tcmalloc_loaded() else tcmalloc_environment()
    if env is not None:
        os.environ.update(env)


def read_only(arrays):
    """(images, labels) that no test can change for the tests after it: writing to them raises."""
    images, labels, _ = arrays
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


@pytest.fixture(scope="session")
def fashion_train():
    """All 60,000 Fashion-MNIST training images (uint8 (N, 28, 28, 1)) and labels (int64), read once a run."""
    return read_only(load_arrays("fashion_mnist", "train"))


@pytest.fixture(scope="session")
def fashion_test():
    """The 10,000 Fashion-MNIST test images and labels, read once a run."""
    return read_only(load_arrays("fashion_mnist", "test"))


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """The app's tiny trained ViT as {"keras", "labels", each quantization, "attention": path}, built once a run."""
    return shared_models(tmp_path_factory)


# The longest files first (measured: docs/benchmarks.md, "The test suite"), so that with `-n 2 --dist loadfile
# --no-loadscope-reorder` (scripts/test.sh) the short ones fill in at the end and no worker waits long for the other.
LONGEST_FIRST = ("test_train.py", "test_train_jax.py", "test_backends.py", "test_docs.py", "test_web_export.py",
                 "test_convert.py", "test_notebooks.py", "test_microbatch.py", "test_app.py", "test_compat.py",
                 "test_ship.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
