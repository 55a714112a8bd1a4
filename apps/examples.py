"""The bundled example images, all real: Fashion-MNIST test images and the photos foolbox 3.3.4 ships.

Fashion-MNIST comes from Debian's dataset-fashion-mnist (IDX files read with gzip + NumPy); foolbox's
20 ImageNet and 20 CIFAR-10 photos are found without importing foolbox (its dependencies are not
installed). Returns (path, caption) pairs; captions carry the true label from the source.
"""

import gzip
import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

# The same folder and override as vit_keras.data.datasets, which this TensorFlow-free module does not import.
FASHION_DIR = Path(os.environ.get("VIT_KERAS_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def read_idx(path):
    """An IDX file (gzip'd or not) -> uint8 array with its stored shape."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError(f"{path} is not a uint8 IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def foolbox_data_dir():
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data"
    return path if path.is_dir() else None


def fashion_mnist_examples(out_dir, count=10):
    """The first ``count`` Fashion-MNIST test images written as PNGs into ``out_dir``."""
    images_file = FASHION_DIR / "t10k-images-idx3-ubyte.gz"
    if not images_file.exists():
        return []
    images = read_idx(images_file)[:count]
    labels = read_idx(FASHION_DIR / "t10k-labels-idx1-ubyte.gz")[:count]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    examples = []
    for i, (image, label) in enumerate(zip(images, labels)):
        name = FASHION_CLASSES[label]
        path = out_dir / f"fashion_mnist_test_{i:02d}_{name.replace('/', '-').replace(' ', '_')}.png"
        if not path.exists():  # a temp file of its own: two processes may fill the same cache at once
            handle, tmp = tempfile.mkstemp(dir=out_dir, suffix=".png")
            os.close(handle)
            try:
                Image.fromarray(image, "L").save(tmp)
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes it 0600: a cache others may read
                os.replace(tmp, path)
            except BaseException:
                os.remove(tmp)
                raise
        examples.append((str(path), f"Fashion-MNIST: {name}"))
    return examples


def foolbox_examples():
    """foolbox's 20 CIFAR-10 test images and 20 ImageNet photos, label from the file name."""
    data = foolbox_data_dir()
    if data is None:
        return []
    examples = []
    for path in sorted(data.glob("cifar10_*.png")):
        label = int(path.stem.rsplit("_", 1)[1])
        examples.append((str(path), f"CIFAR-10: {CIFAR10_CLASSES[label]}"))
    for path in sorted(data.glob("imagenet_*.jpg")):
        examples.append((str(path), f"ImageNet class {path.stem.rsplit('_', 1)[1]}"))
    return examples


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        Path(base).mkdir(parents=True, exist_ok=True)
        return Path(base) / "vit-keras" / "examples"
    except OSError:
        return Path(tempfile.gettempdir()) / "vit-keras-examples"


def bundled_examples(cache_dir=None, fashion_count=10):
    """All example (path, caption) pairs: Fashion-MNIST first, then CIFAR-10, then ImageNet."""
    return fashion_mnist_examples(cache_dir or default_cache_dir(), fashion_count) + foolbox_examples()


if __name__ == "__main__":  # python -m vit_keras.apps.examples OUT_DIR [COUNT]: write Fashion-MNIST test PNGs
    import sys

    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m vit_keras.apps.examples OUT_DIR [COUNT]")
    written = fashion_mnist_examples(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 10)
    print(f"wrote {len(written)} Fashion-MNIST test images to {sys.argv[1]}")
