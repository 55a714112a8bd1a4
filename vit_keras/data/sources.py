"""Where a split's images come from: decoded into memory, or streamed from disk as training reads them.

A folder split is listed first (``FileSource``: its files, labels, and the size and channels they decode to), and
shards (``vit_keras.data.shards``) describe themselves, so ``choose_input`` can weigh a dataset before decoding any
of it: data whose decoded images fit the memory budget (``memory_budget``) is decoded once into arrays
(``vit_keras.data.datasets``), which is fastest; larger data streams (``vit_keras.data.stream`` under TensorFlow,
``vit_keras.data.stream_batches`` elsewhere), decoded by the same ``decode_image``, so either way a model sees the
pixels the app gives it. Other specs ("fashion_mnist", "tfds:NAME") load into memory.
"""

import dataclasses
import logging
import os

import numpy as np

from vit_keras.constants import INPUT_MODES, MEMORY_BUDGET_FRACTION
from vit_keras.data import datasets
from vit_keras.data.arrays import SkipLog, StreamedSplit, match_channels
from vit_keras.data.sampling import apply_limit
from vit_keras.validation import check_choice, pair

log = logging.getLogger("vit_keras.data.sources")

GRAY_MODES = ("1", "L", "I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # Pillow modes decode_image gives one channel
CHANNEL_SAMPLE = 2000  # the file headers read to tell gray data from colour
STREAMED_SPECS = ("folder:", "shards:")


@dataclasses.dataclass
class FileSource(StreamedSplit):
    """A folder split, listed but not decoded: image files, int64 labels, the class names, the (h, w, c) every
    image decodes to, which images these are, and what a ``limit`` kept (for printouts)."""

    files: list
    labels: np.ndarray
    class_names: list
    image_shape: tuple
    source: str = ""
    skips: SkipLog = dataclasses.field(default_factory=SkipLog)
    limit_note: str = ""

    def __len__(self):
        return len(self.files)

    def read(self, index):
        """Image ``index`` as uint8 (h, w, c), decoded as ``vit_keras.data.datasets.decode_image`` decodes it;
        raises on an unreadable file."""
        image = datasets.decode_image(self.files[index], self.image_shape[:2])
        return match_channels(image, self.image_shape[2])

    def read_or_none(self, index):
        """``read``, or None (the file logged in ``skips``) for an unreadable file."""
        try:
            return self.read(index)
        except Exception as error:  # Pillow raises many types for bad files
            self.skips.add(self.files[index], error)
            return None

    def examples(self):
        """(image, label) of each readable image in order (an unreadable one is logged in ``skips``)."""
        for index in range(len(self)):
            image = self.read_or_none(index)
            if image is not None:
                yield image, self.labels[index]

    def subset(self, indices, source=None):
        """The examples at ``indices`` (sharing this source's log of unreadable files)."""
        return dataclasses.replace(self, files=[self.files[i] for i in indices], labels=self.labels[indices],
                                   source=self.source if source is None else source, skips=self.skips)

    def head(self, count):
        """The first ``count`` images."""
        return self if count >= len(self) else self.subset(np.arange(count))

    def part(self, index, count):
        """Worker ``index`` of ``count``'s part: every count-th image."""
        return self if count == 1 else self.subset(np.arange(index, len(self), count))

    def sample(self, count, seed=0):
        """Up to ``count`` readable images of a seeded draw, with their labels (uint8 (n, h, w, c), int64)."""
        order = np.random.default_rng(seed).permutation(len(self))[:count]
        kept = [(image, self.labels[i]) for i in order if (image := self.read_or_none(i)) is not None]
        if not kept:
            raise ValueError(f"No readable images in {self.source or 'the folder'}.")
        return np.stack([image for image, _ in kept]), np.asarray([label for _, label in kept], np.int64)

    def decode_all(self):
        """The split decoded into memory: a ``vit_keras.data.datasets.ArrayDataset``."""
        return datasets.decode_files(self.files, self.labels, self.class_names, self.image_shape[:2], self.source)


def header_channels(files, seed=0, sample=CHANNEL_SAMPLE):
    """3 if any of a seeded sample of ``files`` decodes to colour, else 1, from the headers alone."""
    from PIL import Image

    order = np.random.default_rng(seed).permutation(len(files))[:sample]
    for index in order:
        try:
            with Image.open(files[index]) as image:
                if image.mode not in GRAY_MODES:
                    return 3
        except Exception:  # decoding reports it, with the reason
            continue
    return 1


def list_folder_split(path, split="train", seed=0, val_fraction=0.1, image_size=None, limit=None, whole=False):
    """A ``FileSource`` of one split of a folder dataset (the split ``datasets.load_dataset`` decodes), decoded at
    ``image_size`` (default: the folder's most common size, at most ``datasets.MAX_SIDE`` a side)."""
    files, labels, class_names, source = datasets.folder_split(path, split, seed, val_fraction, whole)
    notes = []  # what a limit kept: said by a stream, or by the decoder (which tops up unreadable ones)
    if limit is not None:  # a seeded, class-balanced sample
        kept = apply_limit(labels, limit, seed, class_names, log=notes.append)
        files, labels = [files[i] for i in kept], labels[kept]
    size = pair(image_size, "image_size") if image_size is not None else datasets.common_size(files, path)
    if size is None:
        raise ValueError(f"No readable images in the {split!r} split of {path!r} ({len(files)} unreadable).")
    return FileSource(files, labels, class_names, (*size, header_channels(files, seed)), source,
                      limit_note="".join(notes))


def list_split(spec, split="train", seed=0, val_fraction=0.1, image_size=None, limit=None, whole_folder=False,
               data_dir=None):
    """A stream source for ``spec``'s split, read from disk as it is used: a ``FileSource`` ("folder:PATH") or a
    ``vit_keras.data.shards.ShardSource`` ("shards:PATH"); None for data that loads into memory only."""
    del data_dir  # tfds' folder: tfds data loads into memory
    if str(spec).startswith("folder:"):
        return list_folder_split(spec[len("folder:"):], split, seed, val_fraction, image_size, limit, whole_folder)
    if str(spec).startswith("shards:"):
        from vit_keras.data.shards import open_shards

        return open_shards(spec[len("shards:"):], split, image_size, limit)
    return None


def steps_per_pass(source, batch_size, workers=1, drop_remainder=True):
    """The batches each of ``workers`` can take from its part of ``source`` (``part``) in a pass: the fewest any
    worker can, so that all take the same number. ``batch_size`` is global."""
    share = batch_size // workers
    sizes = [len(source.part(index, workers)) for index in range(workers)]
    return min(sizes) // share if drop_remainder else -(-max(sizes) // share)


def memory_bytes():
    """The memory this process may use: the machine's, or its control group's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def memory_budget():
    """The decoded size up to which data is kept in memory: ``MEMORY_BUDGET_FRACTION`` of ``memory_bytes``."""
    return int(memory_bytes() * MEMORY_BUDGET_FRACTION)


def describe_bytes(count):
    """A byte count for people: GB, MB or KB."""
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if count >= size / 10:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1e3:.1f} KB"


def choose_input(mode, sources, budget=None):
    """("memory" | "stream", why): how to read ``sources`` (stream sources of the splits a run reads) under
    ``mode`` ("auto" weighs their decoded size against ``budget``, default ``memory_budget()``)."""
    check_choice(mode, "input_mode", INPUT_MODES)
    total = sum(source.decoded_bytes() for source in sources)
    h, w, c = sources[0].image_shape
    size = (f"{sum(len(s) for s in sources):,} images decode to {describe_bytes(total)} at {h}x{w}x{c}")
    if mode != "auto":
        forced = "--in-memory (input_mode='memory')" if mode == "memory" else "--stream (input_mode='stream')"
        return mode, f"{size}; {forced} asked for it"
    budget = memory_budget() if budget is None else budget
    limit = (f"the memory budget of {describe_bytes(budget)} ({MEMORY_BUDGET_FRACTION:.0%} of "
             f"{describe_bytes(memory_bytes())})")
    if total <= budget:
        return "memory", f"{size}, within {limit}; --stream streams them instead"
    return "stream", f"{size}, more than {limit}; --in-memory decodes them all instead"


def load_splits(spec, splits, input_mode="auto", **options):
    """(the data of each of ``splits``, "memory" | "stream", why): arrays (``datasets.ArrayDataset``) or stream
    sources (``list_split``), as ``choose_input`` decides for all of them together. ``options``: the
    ``datasets.load_dataset`` keywords (limit, seed, data_dir, val_fraction, image_size, whole_folder)."""
    check_choice(input_mode, "input_mode", INPUT_MODES)
    if not str(spec).startswith(STREAMED_SPECS):
        if input_mode == "stream":
            raise ValueError(f"`input_mode`='stream' streams 'folder:PATH' and 'shards:PATH' data; {spec!r} loads "
                             "into memory: use 'auto' or 'memory', or write it as shards with `vit-keras prepare`.")
        loaded = [datasets.load_dataset(spec, split, **options) for split in splits]
        return loaded, "memory", f"{spec} loads into memory"
    listed = [list_split(spec, split, **options) for split in splits]
    mode, why = choose_input(input_mode, listed)
    if mode == "stream":
        for source in listed:
            if source.limit_note:
                print(source.limit_note)
        return listed, mode, why
    if options.get("limit") is not None:  # the first `limit` readable images, past unreadable ones
        return [datasets.load_dataset(spec, split, **options) for split in splits], mode, why
    return [source.decode_all() for source in listed], mode, why


def load_in_memory(spec, split="train", what="this command", **options):
    """``spec``'s split decoded into memory (a ``datasets.ArrayDataset``), or a clear error where its decoded
    images exceed the memory budget (``what`` reads them all at once: a smaller ``limit`` helps)."""
    if options.get("limit") is not None or not str(spec).startswith(STREAMED_SPECS):  # the first N: decoded alone
        return datasets.load_dataset(spec, split, **options)
    listed = list_split(spec, split, **options)
    if choose_input("auto", [listed])[0] == "stream":
        raise ValueError(f"{what} reads its images into memory, and the {split!r} split of {spec} is too large: "
                         f"{choose_input('auto', [listed])[1].split(';')[0]}. Pass a `limit` (--limit N).")
    return listed.decode_all()
