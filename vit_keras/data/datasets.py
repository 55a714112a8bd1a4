"""Datasets as in-memory arrays: Fashion-MNIST, any tfds dataset, or a folder of images.

``load_arrays(spec, split)`` returns ``(images uint8 (N, H, W, C), labels int64 (N,), class_names)``
with ``spec`` one of

  "fashion_mnist"   the IDX files of the Debian package ``dataset-fashion-mnist``
                    (/usr/share/datasets/fashion-mnist), else tfds ``fashion_mnist``;
  "tfds:NAME"       a tfds dataset (``data_dir`` as for ``tfds.load``); one with only a train split gives a
                    seeded held-out part of it as "val"/"test";
  "shards:PATH"     shards written by `vit-keras prepare` (``vit_keras.data.shards``), decoded whole;
  "folder:PATH"     one sub-folder per class; a seeded split gives "train" and "val"/"test" (or, with
                    ``whole_folder``, all of it). A PATH whose sub-folders are train/, val/ or validation/ and
                    test/ (class sub-folders in each) gives those splits as they are. Each image is
                    resized as soon as it is decoded (to ``image_size``, else the most common size, at most
                    MAX_SIDE), so a folder of phone photos costs memory at the model's size, not the camera's.

Images are decoded here, once (Pillow for folders), so the tf.data pipeline in
``vit_keras.data.pipeline`` only reads arrays and keeps up with training on a small CPU. Data too large for memory
streams instead (``vit_keras.data.sources``), decoded by the same ``decode_image``.
"""

import collections
import gzip
import logging
import os
import struct

import numpy as np

from vit_keras.constants import SPLITS
from vit_keras.data.arrays import ArrayDataset, split_indices, stack_images
from vit_keras.data.sampling import apply_limit, balanced_order, describe
from vit_keras.validation import pair

log = logging.getLogger("vit_keras.data.datasets")

FASHION_MNIST_DIR = os.environ.get("VIT_KERAS_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
MAX_SIDE = 512  # the longest side folder images keep when no `image_size` is asked for
DATA_SPECS = "'fashion_mnist', 'tfds:NAME', 'folder:PATH' or 'shards:PATH'"


def load_arrays(spec, split="train", limit=None, seed=0, **kwargs):
    """``(images uint8 (N,H,W,C), labels int64 (N,), class_names)`` for a dataset spec; see the module doc."""
    data = load_dataset(spec, split=split, limit=limit, seed=seed, **kwargs)
    return data.images, data.labels, data.class_names


def load_dataset(spec, split="train", limit=None, seed=0, data_dir=None, val_fraction=0.1, image_size=None,
                 whole_folder=False):
    """An ``ArrayDataset`` (with the list of skipped files, and which images they are) for ``spec``.

    ``limit`` keeps a seeded, class-balanced sample of N examples (``vit_keras.data.sampling``), printing what it kept.
    ``whole_folder``: a plain class-per-sub-folder tree gives all its images for any split (evaluating on a
    folder the model was not trained on), not the seeded held-out part.
    ``image_size`` (int or (h, w)) resizes folder images as they are decoded; by default a folder is resized to
    its most common size, scaled down to at most ``MAX_SIDE`` on the long side.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown `split`={split!r}; valid values are {', '.join(map(repr, SPLITS))}.")
    if limit is not None and int(limit) < 1:
        raise ValueError(f"`limit` must be a positive int or None; got {limit}.")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"`data` must be {DATA_SPECS}; got {spec!r}.")
    if spec == "fashion_mnist":
        data = _fashion_mnist(split, data_dir)
        kept = apply_limit(data.labels, limit, seed, data.class_names)
        data.images, data.labels = data.images[kept], data.labels[kept]
    elif spec.startswith("tfds:"):
        from vit_keras.data.tfds_source import load_tfds

        data = load_tfds(spec[5:], split, data_dir, seed, val_fraction, limit)
    elif spec.startswith("folder:"):
        data = _folder(spec[7:], split, seed, val_fraction, image_size, limit, whole_folder)
    elif spec.startswith("shards:"):
        from vit_keras.data.shards import open_shards

        data = open_shards(spec[7:], split, image_size, limit).decode_all()
    else:
        raise ValueError(f"Unknown dataset {spec!r}; valid values are {DATA_SPECS}.")
    return data


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array: the MNIST family's format."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number).")
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    dtype, ndim = raw[2], raw[3]
    if dtype not in dtypes:
        raise ValueError(f"{path}: unknown IDX element type 0x{dtype:02x}.")
    shape = struct.unpack(f">{ndim}I", raw[4: 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=dtypes[dtype], offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: {data.size} values for shape {shape}.")
    return data.reshape(shape)


def _fashion_mnist(split, data_dir):
    prefix = "train" if split == "train" else "t10k"  # Fashion-MNIST has no validation split: val = test
    images_path = os.path.join(FASHION_MNIST_DIR, f"{prefix}-images-idx3-ubyte.gz")
    labels_path = os.path.join(FASHION_MNIST_DIR, f"{prefix}-labels-idx1-ubyte.gz")
    if os.path.exists(images_path) and os.path.exists(labels_path):
        images = read_idx(images_path).astype(np.uint8)[..., None]
        labels = read_idx(labels_path).astype(np.int64)
        return ArrayDataset(images, labels, list(FASHION_MNIST_CLASSES))
    log.info("%s not found; falling back to tfds 'fashion_mnist'.", images_path)
    from vit_keras.data.tfds_source import load_tfds

    return load_tfds("fashion_mnist", split, data_dir)


def class_folder_names(path):
    """The sorted class sub-folder names of ``path`` (hidden ones skipped), without reading the images."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Image folder {path!r} does not exist (expected one sub-folder per class).")
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and not d.startswith("."))


def list_folder(path, require_classes=True):
    """``(files, labels, class_names)`` of a class-per-sub-folder tree, sorted, with clear errors.

    ``require_classes``: refuse a tree with images of fewer than two classes (a training set); an evaluation split
    may hold fewer."""
    class_names = class_folder_names(path)
    for name in class_names:  # they become labels.txt, one per line, and the model's metadata
        if name != name.strip() or not name.isprintable():  # not printable: also undecodable bytes, newlines
            raise ValueError(f"Class folder {os.path.join(path, name)!r}: class names (folder names) must be "
                             "printable UTF-8 without leading or trailing spaces; rename it.")
    files, labels = [], []
    for label, name in enumerate(class_names):
        for root, dirs, names in os.walk(os.path.join(path, name)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .thumbnails, .@__thumb: image copies
            for file in sorted(names):
                if file.lower().endswith(IMAGE_EXTENSIONS) and not file.startswith("."):
                    files.append(os.path.join(root, file))
                    labels.append(label)
    if not files:
        raise ValueError(f"Image folder {path!r} has no images ({', '.join(IMAGE_EXTENSIONS)}) in class sub-folders.")
    used = sorted(set(labels))
    if require_classes and len(used) < 2:
        found = class_names[used[0]] if used else "none"
        raise ValueError(f"Image folder {path!r} has images of only one class ({found}); a classifier needs >= 2.")
    return files, np.asarray(labels, np.int64), class_names


def decode_image(path, size=None):
    """A uint8 (H, W, 1|3) array from an image file; raises on corrupt files.

    The pixels the app decodes on device (apps/images.py, which may not import this package): EXIF
    orientation applied, 16-bit data scaled by 1/257, float data taken as 0-1 when it fits, alpha composited
    on white. tests/test_data.py checks that the two agree. ``size`` (h, w): decode a JPEG at a reduced
    scale near it and resize to it, as the app prepares a model's input.
    """
    from PIL import Image

    array = _decode(path, size)
    if size is None or array.shape[:2] == tuple(size):
        return array
    resized = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    resized = resized.resize((size[1], size[0]), Image.BILINEAR, reducing_gap=3.0)
    return np.asarray(resized).reshape(*size, array.shape[-1])


def _decode(path, size):
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        if size is not None and image.format == "JPEG":  # draft works on the stored, not the upright, image
            upright = image.getexif().get(0x0112, 1) not in (5, 6, 7, 8)
            image.draft("RGB" if image.mode != "L" else "L", (size[1], size[0]) if upright else tuple(size))
        image = ImageOps.exif_transpose(image)
        image.load()
        if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
            array = np.asarray(image, np.float64)
            if image.mode == "F" and array.size and array.min() >= 0 and array.max() <= 1.0:
                array = array * 255.0
            elif image.mode.startswith("I;16") or (array.size and array.max() > 255):
                array = array / 257.0
            return np.clip(array + 0.5, 0, 255).astype(np.uint8)[..., None]
        if image.mode in ("L", "1"):
            return np.asarray(image.convert("L"))[..., None]
        if "A" in image.mode or (image.mode == "P" and "transparency" in image.info):
            background = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, image.convert("RGBA"))
        return np.asarray(image.convert("RGB"))


# A folder whose sub-folders are only these holds its splits as given (Keras's image_dataset_from_directory,
# torchvision's ImageFolder and most Kaggle sets are laid out so): split -> the sub-folder names it may have.
SPLIT_FOLDERS = {"train": ("train",), "val": ("val", "validation"), "test": ("test",)}


def folder_layout(path):
    """``{split: sub-folder path}`` when ``path`` holds split folders (train/, val/ or validation/, test/), else {}."""
    if not os.path.isdir(path):
        return {}
    subs = {d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and not d.startswith(".")}
    names = {name for names in SPLIT_FOLDERS.values() for name in names}
    if "train" not in subs or not subs <= names:
        return {}
    if {"val", "validation"} <= subs:
        raise ValueError(f"Image folder {path!r} has both val/ and validation/; keep one.")
    return {split: os.path.join(path, name) for split, options in SPLIT_FOLDERS.items()
            for name in options if name in subs}


def folder_split(path, split, seed, val_fraction, whole=False):
    """``(files, labels, class_names, source)`` of one split of a folder dataset.

    A folder of split folders gives its splits as given: val is val/ (else test/), test is test/ (else val/); where
    neither exists, a seeded part of train/ is held out. A plain class-per-sub-folder tree gives a seeded held-out
    part as val/test, or, with ``whole``, all of it (a folder the model was not trained on).
    """
    layout = folder_layout(path)
    if not layout:
        files, labels, class_names = list_folder(path)
        if whole:
            return (*shuffled(files, labels, seed), class_names, "the whole folder")
        return _held_out(files, labels, class_names, split, seed, val_fraction)
    train_files, train_labels, class_names = list_folder(layout["train"])
    for folder in layout.values():
        others = class_folder_names(folder)
        if others != class_names:
            raise ValueError(f"The split folders of {path!r} name different classes: train/ has {class_names}, "
                             f"{os.path.basename(folder)}/ has {others}. Every split needs the same class folders.")
    given = layout.get(split) or layout.get({"val": "test", "test": "val"}.get(split, ""))
    if split == "train" and len(layout) > 1 or split != "train" and given:
        folder = layout["train"] if split == "train" else given
        files, labels = (train_files, train_labels) if split == "train" else list_folder(folder, False)[:2]
        missing = sorted(set(class_names) - {class_names[i] for i in set(labels.tolist())})
        if missing:
            log.warning("%s/ of %s has no images of %d class(es): %s.", os.path.basename(folder), path,
                        len(missing), ", ".join(missing))
        return (*shuffled(files, labels, seed), class_names, f"its {os.path.basename(folder)}/ folder")
    return _held_out(train_files, train_labels, class_names, split, seed, val_fraction, "train/")


def shuffled(files, labels, seed):
    """``files`` and ``labels`` in a seeded order, as a held-out part is: the first N are a sample of all classes."""
    order = np.random.default_rng(seed).permutation(len(files))
    return [files[i] for i in order], labels[order]


def _held_out(files, labels, class_names, split, seed, val_fraction, where="the folder"):
    train, val = split_indices(len(files), seed, val_fraction)
    chosen = train if split == "train" else val
    part = "the training part" if split == "train" else f"the seeded {100 * val_fraction:g}% held-out part"
    return [files[i] for i in chosen], labels[chosen], class_names, f"{part} of {where} (seed {seed})"


def _folder(path, split, seed, val_fraction, image_size, limit=None, whole=False):
    files, labels, class_names, source = folder_split(path, split, seed, val_fraction, whole)
    target = pair(image_size, "image_size") if image_size is not None else common_size(files, path)
    return decode_files(files, labels, class_names, target, source, limit, f"the {split!r} split of {path!r}", seed)


def decode_files(files, labels, class_names, target, source="", limit=None, where="the folder", seed=0):
    """An ``ArrayDataset`` of the readable ones of ``files`` (``limit``: a class-balanced sample of that many,
    drawn with ``seed``), decoded at ``target`` (h, w), in the files' order."""
    images, kept, skipped = [], [], []
    for i in balanced_order(labels, seed) if limit is not None and limit < len(files) else range(len(files)):
        if limit is not None and len(images) == int(limit):  # a class-balanced sample of readable images
            break
        try:
            images.append(decode_image(files[i], target))
            kept.append(i)
        except Exception as error:  # Pillow raises many types for bad files
            skipped.append((files[i], f"{type(error).__name__}: {error}"))
    if limit is not None and len(kept) < len(files):
        print(describe(labels, kept, class_names, limit, seed))
    if skipped:
        log.warning("Skipped %d unreadable image(s) in %s, e.g. %s", len(skipped), where, skipped[0][0])
    if not images:
        raise ValueError(f"No readable images in {where} ({len(skipped)} skipped).")
    images = stack_images([images[j] for j in np.argsort(kept)], target)  # in the split's order
    return ArrayDataset(images, labels[np.sort(kept)].astype(np.int64), class_names, skipped, source)


def folder_image_size(path):
    """The (h, w) a folder's training images decode to by default, from their headers: see ``common_size``."""
    return common_size(list_folder(folder_layout(path).get("train", path))[0], path)


def common_size(files, path):
    """The most common upright (h, w) of ``files``, read from their headers, scaled to at most MAX_SIDE."""
    from PIL import Image

    sizes = collections.Counter()
    for file in files:
        try:
            with Image.open(file) as image:
                (w, h), orientation = image.size, image.getexif().get(0x0112, 1)
        except Exception:  # decoding reports it, with the reason
            continue
        sizes[(w, h) if orientation in (5, 6, 7, 8) else (h, w)] += 1
    if not sizes:
        return None
    (h, w), _ = sizes.most_common(1)[0]
    if len(sizes) > 1:
        log.warning("Images in %s have %d different sizes; resizing all to the most common, %dx%d.",
                    path, len(sizes), h, w)
    scale = min(1.0, MAX_SIDE / max(h, w))
    if scale < 1.0:
        h, w = max(1, round(h * scale)), max(1, round(w * scale))
        log.info("Decoding the images of %s at %dx%d (at most %d px a side; pass image_size for another size).",
                 path, h, w, MAX_SIDE)
    return h, w
