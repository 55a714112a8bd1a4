"""Decoded images in memory, and the small pieces every source shares: an ``ArrayDataset``, images of mixed sizes
stacked into one array, the seeded train/held-out split, channel matching, and the log of unreadable files."""

import collections
import dataclasses
import logging
import threading

import numpy as np

from vit_keras.constants import LUMA_WEIGHTS

log = logging.getLogger("vit_keras.data")


@dataclasses.dataclass
class ArrayDataset:
    images: np.ndarray  # uint8 (N, H, W, C)
    labels: np.ndarray  # int64 (N,)
    class_names: list
    skipped: list = dataclasses.field(default_factory=list)  # (path, reason) of unreadable files
    source: str = ""  # which images these are, for printouts: "the whole folder", "its test/ folder", ...

    @property
    def num_classes(self):
        return len(self.class_names)

    def __len__(self):
        return len(self.labels)

    @property
    def image_shape(self):
        return tuple(self.images.shape[1:])

    def sample(self, count, seed=0):
        """Up to ``count`` images of a seeded draw, with their labels."""
        order = np.sort(np.random.default_rng(seed).permutation(len(self))[:count])
        return self.images[order], self.labels[order]


def stack_images(images, target_size):
    """One uint8 array from images of possibly mixed sizes and channel counts."""
    channels = 3 if any(im.shape[-1] >= 3 for im in images) else 1
    sizes = collections.Counter(im.shape[:2] for im in images)
    size = tuple(target_size) if target_size else sizes.most_common(1)[0][0]
    if len(sizes) > 1 and not target_size:
        log.warning("Images have %d different sizes; resizing all to %s.", len(sizes), size)
    out = np.empty((len(images), *size, channels), np.uint8)
    from PIL import Image

    for i, im in enumerate(images):
        if im.shape[-1] == 4:
            im = im[..., :3]
        if im.shape[-1] != channels:
            im = np.repeat(im, channels, axis=-1)
        if im.shape[:2] != size:
            resized = Image.fromarray(im.squeeze(-1) if channels == 1 else im).resize(size[::-1], Image.BILINEAR)
            im = np.asarray(resized).reshape(*size, channels)
        out[i] = im
    return out


def split_indices(n, seed, val_fraction):
    """Seeded (train, val) index arrays; val gets at least one example."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"`val_fraction` must be in (0, 1); got {val_fraction}.")
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(int(round(n * val_fraction)), 1), n - 1)
    return order[n_val:], order[:n_val]


def match_channels(image, channels):
    """A decoded (h, w, 1|3) image with ``channels``: gray repeated to RGB (as a folder of mixed images stacks in
    memory), RGB to gray by luma (a gray stream's rare colour image)."""
    if image.shape[-1] == channels:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=-1)
    return np.clip(np.round(image @ np.asarray(LUMA_WEIGHTS)), 0, 255).astype(np.uint8)[..., None]


class SkipLog:
    """The unreadable files a stream met, each once however many epochs meet it again; thread-safe."""

    def __init__(self):
        self.reasons, self.lock = {}, threading.Lock()

    def add(self, path, error):
        with self.lock:
            if path in self.reasons:
                return
            self.reasons[path] = f"{type(error).__name__}: {error}"
        log.warning("Skipped unreadable image %s (%s)", path, self.reasons[path])

    def __len__(self):
        return len(self.reasons)

    def items(self):
        with self.lock:
            return list(self.reasons.items())


class StreamedSplit:
    """What every stream source (a folder's ``FileSource``, shards' ``ShardSource``) answers from its
    ``class_names``, ``image_shape`` (h, w, c), ``skips`` (a ``SkipLog``) and length."""

    limit_note = ""  # the line saying what a ``limit`` kept, where there is one to say (shards are written balanced)

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def skipped(self):
        """(path, reason) of the unreadable files met so far."""
        return self.skips.items()

    def decoded_bytes(self):
        """The bytes the split takes decoded into memory."""
        return len(self) * int(np.prod(self.image_shape))

    def chunks(self, size):
        """(uint8 images, int64 labels) of up to ``size`` readable images at a time, in order, from ``examples``: a
        pass over the split that holds one chunk in memory."""
        images, labels = [], []
        for image, label in self.examples():
            images.append(image)
            labels.append(label)
            if len(images) == size:
                yield np.stack(images), np.asarray(labels, np.int64)
                images, labels = [], []
        if images:
            yield np.stack(images), np.asarray(labels, np.int64)
