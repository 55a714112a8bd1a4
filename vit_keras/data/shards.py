"""Shards: a folder dataset resized and encoded once into TFRecord files, which every backend streams fast.

    SHARDS/shards.json          the manifest: format version, image size, channels, encoding, class names, and
                                each split's files and image counts (written last: a folder without it is no set)
    SHARDS/train-00000.tfrecord a header record (JSON: the same facts and this file's count), then one
    SHARDS/val-00000.tfrecord   tf.train.Example per image (``vit_keras.data.records``): "image" (PNG or JPEG
    ...                         bytes at the image size) and "label"

``write_shards`` (`vit-keras prepare`) decodes each image once, as ``vit_keras.data.datasets.decode_image`` does,
so PNG shards hold exactly the pixels a folder gives in memory; JPEG shards are smaller and lossy. Images are
written in a seeded order, so the first N of a split are a sample of all its classes (a calibration set).
``open_shards`` checks a set before anything trains on it: the version, every file's header, an empty file, and
the image size a model asks for.
"""

import dataclasses
import json
import os

import numpy as np

from vit_keras.constants import SHARD_ENCODINGS, SHARD_VERSION
from vit_keras.data.arrays import ArrayDataset, SkipLog, StreamedSplit, match_channels
from vit_keras.data.records import RecordFile, parse_example, read_first_record
from vit_keras.validation import pair

FORMAT = "vit-keras shards"
MANIFEST = "shards.json"


def shard_error(path, problem):
    return ValueError(f"Shards {path!r}: {problem} Write them again with `vit-keras prepare --data folder:PHOTOS "
                      f"--out {path} --image-size N`.")


def read_manifest(path):
    """The checked manifest of the shard folder ``path``."""
    file = os.path.join(path, MANIFEST)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"Shards {path!r}: there is no {MANIFEST} (a folder that `vit-keras prepare` "
                                "finished writing has one).")
    try:
        with open(file) as f:
            manifest = json.load(f)
    except ValueError as error:
        raise shard_error(path, f"{MANIFEST} is unreadable ({error}).") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != SHARD_VERSION:
        raise shard_error(path, f"they are {manifest.get('format')!r} version {manifest.get('version')!r}; this "
                                f"vit-keras reads {FORMAT!r} version {SHARD_VERSION}.")
    return manifest


def check_header(path, file, manifest, count):
    """A shard file's header record agrees with the manifest, and the file holds images."""
    name = os.path.basename(file)
    if not os.path.isfile(file):
        raise shard_error(path, f"{name} is missing.")
    try:
        header = json.loads(read_first_record(file))
    except ValueError as error:
        raise shard_error(path, f"{name} has no readable header ({error}).") from None
    for key in ("format", "version", "image_size", "channels", "encoding", "class_names"):
        if header.get(key) != manifest[key]:
            raise shard_error(path, f"{name} has {key} {header.get(key)!r}, the set {manifest[key]!r}.")
    if count < 1 or header.get("count") != count:
        raise shard_error(path, f"{name} is empty." if count < 1 else
                          f"{name} holds {header.get('count')} images, the manifest says {count}.")


@dataclasses.dataclass
class ShardSource(StreamedSplit):
    """One split of a shard set: its files and their image counts, the class names, the (h, w, c) images, their
    encoding, and which images these are (for printouts)."""

    files: list
    counts: list
    class_names: list
    image_shape: tuple
    encoding: str
    source: str = ""
    skips: SkipLog = dataclasses.field(default_factory=SkipLog)

    def __len__(self):
        return int(sum(self.counts))

    def record_bytes(self):
        """The mean size of an encoded image."""
        return sum(os.path.getsize(f) for f in self.files) / max(len(self), 1)

    def part(self, index, count):
        """Worker ``index`` of ``count``'s files (every count-th): each worker reads only its own."""
        if count == 1:
            return self
        return dataclasses.replace(self, files=self.files[index::count], counts=self.counts[index::count])

    def head(self, count):
        """The first ``count`` images."""
        kept = np.minimum(self.counts, np.maximum(int(count) - np.cumsum([0, *self.counts[:-1]]), 0))
        return dataclasses.replace(self, files=[f for f, k in zip(self.files, kept) if k],
                                   counts=[int(k) for k in kept if k])

    def decode(self, data, where):
        """(uint8 image, label) of a record, or None (logged in ``skips``) when its image is unreadable."""
        from io import BytesIO

        from PIL import Image

        try:
            encoded, label = parse_example(data)
            with Image.open(BytesIO(encoded)) as image:
                pixels = np.asarray(image)
            pixels = match_channels(pixels[..., None] if pixels.ndim == 2 else pixels, self.image_shape[2])
            if pixels.shape != tuple(self.image_shape):
                raise ValueError(f"an image of shape {pixels.shape}, not {tuple(self.image_shape)}")
            return pixels, label
        except Exception as error:  # a damaged record
            self.skips.add(where, error)
            return None

    def examples(self, limit=None):
        """(image, label) of each readable record in order, reading the files one after another."""
        for file, count in zip(self.files, self.counts):
            records = RecordFile(file)
            for index in range(1, 1 + count):
                if limit is not None and limit <= 0:
                    return
                example = self.decode(records.read(index), f"{file} record {index}")
                if example is not None:
                    limit = None if limit is None else limit - 1
                    yield example

    def sample(self, count, seed=0):
        """The first ``count`` readable images (the shards hold them in a seeded, class-balanced order) and their
        labels."""
        del seed  # written shuffled
        pairs = list(self.examples(count))
        if not pairs:
            raise ValueError(f"No readable images in {self.source}.")
        return np.stack([image for image, _ in pairs]), np.asarray([label for _, label in pairs], np.int64)

    def decode_all(self):
        """The split decoded into memory: a ``vit_keras.data.arrays.ArrayDataset``."""
        images, labels = self.sample(len(self))
        return ArrayDataset(images, labels, list(self.class_names), self.skipped, self.source)


def split_files(manifest, split):
    """(split name, its entry) for ``split``: a set without val/ reads test/ for validation and the other way."""
    splits = manifest["splits"]
    for name in (split, {"val": "test", "test": "val"}.get(split)):
        if name in splits:
            return name, splits[name]
    raise ValueError(f"Shards have no {split!r} split; they have {', '.join(splits)}.")


def open_shards(path, split="train", image_size=None, limit=None):
    """A checked ``ShardSource`` of ``split`` (its first ``limit`` images: `prepare` writes them in a seeded,
    class-balanced order, so any first N are a balanced sample); ``image_size``: the model's, which must be the
    shards'."""
    manifest = read_manifest(path)
    size = tuple(manifest["image_size"])
    if image_size is not None and pair(image_size, "image_size") != size:
        raise shard_error(path, f"they hold {size[0]}x{size[1]} images, but the model takes "
                                f"{pair(image_size, 'image_size')[0]}x{pair(image_size, 'image_size')[1]}.")
    name, entry = split_files(manifest, split)
    files = [os.path.join(path, file) for file in entry["files"]]
    counts = [int(count) for count in entry["counts"]]
    if not files:
        raise shard_error(path, f"the {name!r} split has no shard files.")
    for file, count in zip(files, counts):
        check_header(path, file, manifest, count)
    source = f"its {name} shards ({len(entry['files'])} file(s), {entry.get('source', '')})"
    shards = ShardSource(files, counts, list(manifest["class_names"]), (*size, manifest["channels"]),
                         manifest["encoding"], source)
    return shards if limit is None else shards.head(limit)


def check_encoding(encoding):
    if encoding not in SHARD_ENCODINGS:
        raise ValueError(f"Unknown `encoding`={encoding!r}; valid values are {', '.join(map(repr, SHARD_ENCODINGS))}.")
    return encoding
