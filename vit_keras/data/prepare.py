"""`vit-keras prepare`: write a folder dataset as shards (``vit_keras.data.shards``), each image decoded once.

Every split the folder gives is checked (its class folders, its images) before a file is written; the shards of a
split are written one by one, each atomically, and the manifest last, so a folder cut short by a kill has no
manifest and nothing reads it as a set.
"""

import concurrent.futures
import io
import json
import os

import numpy as np

from vit_keras.constants import IMAGES_PER_SHARD, SHARD_VERSION
from vit_keras.data import datasets
from vit_keras.data.records import encode_example
from vit_keras.data.sampling import balanced_order
from vit_keras.data.shards import FORMAT, MANIFEST, check_encoding
from vit_keras.data.arrays import match_channels
from vit_keras.data.sources import header_channels
from vit_keras.files import atomic_path, write_text
from vit_keras.validation import pair

JPEG_QUALITY = 95
PNG_COMPRESSION = 3  # zlib level: smaller files than 1, far faster to write than the default 6


def folder_splits(path, seed, val_fraction):
    """{split: (files, labels, class_names, source)} of every split a folder gives: its split folders, or a
    training part and a seeded held-out part (val)."""
    layout = datasets.folder_layout(path)
    names = [name for name in ("train", "val", "test") if name in layout] if layout else ["train", "val"]
    if names == ["train"]:
        names = ["train", "val"]  # train/ alone: a held-out part of it, as training reads it
    return {name: datasets.folder_split(path, name, seed, val_fraction) for name in names}


def encode_image(file, size, channels, encoding):
    """The encoded bytes of ``file`` decoded at ``size`` with ``channels``, or the error that stopped it."""
    from PIL import Image

    try:
        pixels = match_channels(datasets.decode_image(file, size), channels)
    except Exception as error:  # Pillow raises many types for bad files
        return None, f"{type(error).__name__}: {error}"
    buffer = io.BytesIO()
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
    if encoding == "png":
        image.save(buffer, "PNG", compress_level=PNG_COMPRESSION)
    else:
        image.save(buffer, "JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buffer.getvalue(), None


def write_shard(path, header, examples):
    """A TFRecord file of a JSON header record and the serialized examples, written atomically."""
    import tensorflow as tf

    with atomic_path(path) as temp:
        with tf.io.TFRecordWriter(temp) as writer:
            writer.write(json.dumps(header).encode())
            for example in examples:
                writer.write(example)


def write_split(out, name, files, labels, facts, images_per_shard, pool, log):
    """Write one split's shards; returns its manifest entry and the unreadable files."""
    entry, skipped = {"files": [], "counts": []}, []
    size, channels, encoding = facts["image_size"], facts["channels"], facts["encoding"]
    for start in range(0, len(files), images_per_shard):
        chunk = range(start, min(start + images_per_shard, len(files)))
        encoded = pool.map(lambda i: encode_image(files[i], size, channels, encoding), chunk)
        examples = []
        for i, (data, error) in zip(chunk, encoded):
            if data is None:
                skipped.append((files[i], error))
            else:
                examples.append(encode_example(data, labels[i]))
        if not examples:  # every image of the chunk unreadable: no empty shard
            continue
        file = f"{name}-{len(entry['files']):05d}.tfrecord"
        write_shard(os.path.join(out, file), dict(facts, split=name, count=len(examples)), examples)
        entry["files"].append(file)
        entry["counts"].append(len(examples))
        log(f"{name}: {sum(entry['counts']):,} of {len(files):,} images written ({file})")
    if not entry["files"]:
        raise ValueError(f"The {name!r} split has no readable images ({len(skipped)} unreadable).")
    return entry, skipped


def check_out(out):
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"`out`={out!r} exists and is not an empty folder; prepare writes into a new one.")


def prepare(data, out, image_size, seed=0, val_fraction=0.1, encoding="png", images_per_shard=IMAGES_PER_SHARD,
            workers=None, log=print):
    """Write the folder dataset ``data`` ("folder:PATH") as shards in ``out`` at ``image_size``; returns the
    manifest. ``val_fraction``, ``seed``: the held-out part of a folder without split folders."""
    if not str(data).startswith("folder:"):
        raise ValueError(f"`data` must be 'folder:PATH' (a folder of class folders, or of train/ val/ test/ "
                         f"folders); got {data!r}.")
    size, encoding = pair(image_size, "image_size"), check_encoding(encoding)
    if not (isinstance(images_per_shard, int) and images_per_shard >= 1):
        raise ValueError(f"`images_per_shard` must be a positive int; got {images_per_shard!r}.")
    check_out(out)
    path = data[len("folder:"):]
    splits = folder_splits(path, seed, val_fraction)  # every split checked before any file is written
    class_names = splits["train"][2]
    facts = dict(format=FORMAT, version=SHARD_VERSION, image_size=list(size),
                 channels=header_channels(splits["train"][0], seed), encoding=encoding, class_names=class_names)
    manifest = dict(facts, data=data, seed=seed, val_fraction=val_fraction, splits={}, skipped=[])
    os.makedirs(out, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        for name, (files, labels, _, source) in splits.items():
            order = balanced_order(labels, seed)  # any first N images of the set are a class-balanced sample
            entry, skipped = write_split(out, name, [files[i] for i in order], np.asarray(labels)[order], facts,
                                         images_per_shard, pool, log)
            manifest["splits"][name] = dict(entry, source=source)
            manifest["skipped"] += [file for file, _ in skipped]
            if skipped:
                log(f"{name}: skipped {len(skipped)} unreadable image(s), e.g. {skipped[0][0]} ({skipped[0][1]})")
    write_text(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1) + "\n")
    return manifest
