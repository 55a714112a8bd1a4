"""faustomorales/vit-keras's ``utils``: ImageNet class names, image reading, ``.npz`` loading (see ``vit_keras.vit``).

``imagenet2012.txt`` holds the 1,000 ImageNet-2012 (ILSVRC-2012) class names in the standard index order
(0 = "tench, Tinca tinca" ... 999 = "toilet tissue, toilet paper, bathroom tissue"): the WordNet synonyms of each
class, as the old package's list gave them ("Eskimo dog, husky"). It was written from the ``IMAGENET_LABELS_LIST``
of tensorflow-datasets (``tensorflow_datasets/datasets/siscore/labels.py``) and checked, index by index, against
that module's name -> index table and Gradio's ``gradio/media_assets/data/imagenet_labels.json``.
"""

import io
import os
import urllib.error
import urllib.parse
import urllib.request
from importlib import resources

import numpy as np

from .constants import IMAGENET_CLASSES_FILE

CLASSES_FILE = IMAGENET_CLASSES_FILE


def get_imagenet_classes():
    """The 1,000 ImageNet-2012 class names, index i = class i of the ImageNet-1k heads."""
    text = resources.files("vit_keras").joinpath(CLASSES_FILE).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read(filepath_or_buffer, size, timeout=None):
    """An image as uint8 RGB (size, size, 3): from a path, an http(s) URL, a file object or a PIL image.

    ``size`` is an int (square, as before) or (height, width). Decoded as training decodes files
    (``vit_keras.data.decode_image``: EXIF orientation, 16-bit, alpha on white), resized bilinearly.
    """
    from PIL import Image

    from .data import decode_image

    shape = _image_shape(size)
    if isinstance(filepath_or_buffer, Image.Image):
        buffer = io.BytesIO()
        filepath_or_buffer.save(buffer, format="PNG")  # lossless, and decoded like any file below
        filepath_or_buffer = buffer
    elif isinstance(filepath_or_buffer, str) and urllib.parse.urlparse(filepath_or_buffer).scheme in ("http", "https"):
        filepath_or_buffer = io.BytesIO(_download_image(filepath_or_buffer, timeout))
    elif isinstance(filepath_or_buffer, (str, os.PathLike)):
        if not os.path.isfile(filepath_or_buffer):
            raise FileNotFoundError(f"`filepath_or_buffer`: no image file at {os.fspath(filepath_or_buffer)!r}.")
    if hasattr(filepath_or_buffer, "seek"):
        filepath_or_buffer.seek(0)
    try:
        image = decode_image(filepath_or_buffer, shape)
    except Exception as error:  # Pillow raises many types for bad data
        raise ValueError(f"`filepath_or_buffer` is not a readable image ({type(error).__name__}: {error})") from None
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def _image_shape(size):
    shape = (size, size) if isinstance(size, (int, np.integer)) else tuple(size) if isinstance(size, (tuple, list)) \
        else None
    if shape is None or len(shape) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in shape):
        raise ValueError(f"`size` must be a positive int or a (height, width) pair; got {size!r}.")
    return tuple(int(v) for v in shape)


def _download_image(url, timeout):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConnectionError(f"Could not download the image {url} ({reason}). If this machine is offline, "
                              "download it elsewhere and pass its local path.") from error


def load_weights_numpy(model, params_path, pretrained_top, num_x_patches=None, num_y_patches=None):
    """Load a Google ``.npz`` (a path or URL) into a model from ``vit_keras.vit``, with ``vit_keras.weights``.

    ``pretrained_top=False`` leaves the checkpoint's head out: the model's head starts at zero. The position
    embedding is resampled to the model's patch grid by the loader (``num_x_patches`` / ``num_y_patches``
    are accepted for the old signature and not needed).
    """
    from .vit import vision_transformer_of
    from .weights import load_weights

    vit = vision_transformer_of(model)
    load_weights(vit, params_path)
    if not pretrained_top and vit.head is not None:
        for variable in (vit.head.kernel, vit.head.bias):
            variable.assign(np.zeros(variable.shape, variable.dtype))
    return model
