"""`vit-keras prepare`: write a folder dataset as shards (``vit_keras.data.shards``), each image decoded once.

Every split the folder gives is checked (its class folders, its images) before a file is written; the shards of a
split are written one by one, each atomically, and the manifest last, so a folder cut short by a kill has no
manifest and nothing reads it as a set.

A rerun resumes: ``prepare.json`` (written first) holds the settings and each split's file list digest; the same
command keeps every finished shard that checks (its header and record lengths) and writes the rest, ending with
the manifest and records an uninterrupted run writes. Other settings are refused by name; a folder that holds
files ``prepare`` did not write is refused, and nothing in it is deleted. The folder is held (``vit_keras.locks``)
while it is written.
"""

import concurrent.futures
import contextlib
import errno
import hashlib
import io
import json
import os

import numpy as np

from vit_keras import locks
from vit_keras.constants import IMAGES_PER_SHARD, SHARD_VERSION
from vit_keras.data import datasets
from vit_keras.data.records import RecordFile, encode_example, read_first_record
from vit_keras.data.sampling import balanced_order
from vit_keras.data.shards import FORMAT, MANIFEST, check_encoding
from vit_keras.data.arrays import match_channels
from vit_keras.data.sources import header_channels
from vit_keras.files import atomic_path, write_text
from vit_keras.validation import pair

PROGRESS = "prepare.json"  # a prepare's settings while it runs: a rerun with the same ones resumes
SETTINGS = ("data", "image_size", "seed", "val_fraction", "encoding", "images_per_shard", "channels", "class_names",
            "files")  # what a rerun must share with the run it resumes
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

    with atomic_path(path, sum(len(example) + 16 for example in examples)) as temp:
        try:
            with tf.io.TFRecordWriter(temp) as writer:
                writer.write(json.dumps(header).encode())
                for example in examples:
                    writer.write(example)
        except tf.errors.ResourceExhaustedError as error:  # TensorFlow's word for ENOSPC: a DiskFull naming path
            raise OSError(errno.ENOSPC, str(error)) from error


def finished_shard(path, facts, start):
    """The header of the shard at ``path`` if it is a finished one of this prepare for the chunk at ``start``
    (its facts, its first image and its record count check), else None."""
    try:
        header = json.loads(read_first_record(path))
        records = len(RecordFile(path))
    except (OSError, ValueError):
        return None
    same = all(header.get(key) == value for key, value in facts.items()) and header.get("start") == start
    return header if same and records == header.get("count", -1) + 1 else None


def write_split(out, name, files, labels, facts, images_per_shard, pool, log):
    """Write one split's shards, keeping those a run cut short finished; returns its manifest entry and the
    unreadable files."""
    entry, skipped, kept = {"files": [], "counts": []}, [], 0
    for start in range(0, len(files), images_per_shard):
        file = f"{name}-{len(entry['files']):05d}.tfrecord"
        header = finished_shard(os.path.join(out, file), dict(facts, split=name), start)
        if header is None:
            chunk = range(start, min(start + images_per_shard, len(files)))
            header, unreadable = encode_shard(os.path.join(out, file), files, labels, chunk,
                                              dict(facts, split=name, start=start), pool)
            if header is None:  # every image of the chunk unreadable: no empty shard
                skipped += unreadable
                continue
        else:
            kept += 1
        skipped += [(image, error) for image, error in header["skipped"]]
        entry["files"].append(file)
        entry["counts"].append(header["count"])
        log(f"{name}: {sum(entry['counts']):,} of {len(files):,} images written ({file})")
    if kept:
        log(f"{name}: kept {kept} shard(s) a run cut short had finished.")
    if not entry["files"]:
        raise ValueError(f"The {name!r} split has no readable images ({len(skipped)} unreadable).")
    return entry, skipped


def encode_shard(path, files, labels, chunk, header, pool):
    """Encode the images ``chunk`` indexes and write them as the shard ``path``: (its header, or None where none
    of them is readable; the unreadable (file, error) pairs)."""
    size, channels, encoding = header["image_size"], header["channels"], header["encoding"]
    examples, skipped = [], []
    for i, (data, error) in zip(chunk, pool.map(lambda i: encode_image(files[i], size, channels, encoding), chunk)):
        if data is None:
            skipped.append((files[i], error))
        else:
            examples.append(encode_example(data, labels[i]))
    if not examples:
        return None, skipped
    header = dict(header, count=len(examples), skipped=skipped)
    write_shard(path, header, examples)
    return header, skipped


def folder_state(out, settings):
    """How ``out`` stands for a prepare with ``settings``: "new", "resume" or "done" (with the manifest); a
    ValueError names other settings, or files prepare did not write."""
    names = sorted(n for n in os.listdir(out) if n != locks.LOCK_NAME and not n.startswith(".tmp-"))
    if not names:
        return "new", None
    for state, file in (("done", MANIFEST), ("resume", PROGRESS)):
        if file in names:
            with open(os.path.join(out, file)) as f:
                recorded = json.load(f)
            changed = [f"{key}: {recorded.get(key)!r} -> {settings[key]!r}" if key != "files" else
                       "the folder's images (other files or another order)"
                       for key in SETTINGS if recorded.get(key) != settings[key]
                       and (key in recorded or state == "resume")]  # an older version's manifest lacks some
            if changed:
                what = "finished shards" if state == "done" else "shards of a prepare cut short"
                raise ValueError(f"`out`={out!r} holds {what} with other settings ({'; '.join(changed)}). Rerun "
                                 "with the same settings to resume them, or write to another folder.")
            return state, recorded
    raise ValueError(f"`out`={out!r} holds files `vit-keras prepare` did not write ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''}): write into a new or empty folder. Nothing was deleted.")


def prepare(data, out, image_size, seed=0, val_fraction=0.1, encoding="png", images_per_shard=IMAGES_PER_SHARD,
            workers=None, log=print):
    """Write the folder dataset ``data`` ("folder:PATH") as shards in ``out`` at ``image_size``, or resume a
    prepare of it cut short there; returns the manifest. ``val_fraction``, ``seed``: the held-out part of a
    folder without split folders."""
    if not str(data).startswith("folder:"):
        raise ValueError(f"`data` must be 'folder:PATH' (a folder of class folders, or of train/ val/ test/ "
                         f"folders); got {data!r}.")
    size, encoding = pair(image_size, "image_size"), check_encoding(encoding)
    if not (isinstance(images_per_shard, int) and images_per_shard >= 1):
        raise ValueError(f"`images_per_shard` must be a positive int; got {images_per_shard!r}.")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"`out`={out!r} is a file; prepare writes into a new or empty folder.")
    path = data[len("folder:"):]
    splits = folder_splits(path, seed, val_fraction)  # every split checked before any file is written
    class_names = splits["train"][2]
    facts = dict(format=FORMAT, version=SHARD_VERSION, image_size=list(size),
                 channels=header_channels(splits["train"][0], seed), encoding=encoding, class_names=class_names)
    orders = {name: balanced_order(labels, seed) for name, (_, labels, _, _) in splits.items()}
    settings = dict(data=data, image_size=list(size), seed=seed, val_fraction=val_fraction, encoding=encoding,
                    images_per_shard=images_per_shard, channels=facts["channels"], class_names=class_names,
                    files={name: digest([splits[name][0][i] for i in order]) for name, order in orders.items()})
    with locks.hold(out, "prepare", log=log):
        state, recorded = folder_state(out, settings)
        if state == "done":
            log(f"{out} already holds these shards; nothing to do.")
            return recorded
        for leftover in (n for n in os.listdir(out) if n.startswith(".tmp-")):  # our own, from a kill mid-write
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out, leftover))
        if state == "new":
            write_text(os.path.join(out, PROGRESS), json.dumps(settings, indent=1) + "\n")
        manifest = dict(facts, **{key: settings[key] for key in ("data", "seed", "val_fraction")}, splits={},
                        skipped=[])
        with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
            for name, (files, labels, _, source) in splits.items():
                order = orders[name]  # any first N images of the set are a class-balanced sample
                entry, skipped = write_split(out, name, [files[i] for i in order], np.asarray(labels)[order], facts,
                                             images_per_shard, pool, log)
                manifest["splits"][name] = dict(entry, source=source)
                manifest["skipped"] += [file for file, _ in skipped]
                if skipped:
                    log(f"{name}: skipped {len(skipped)} unreadable image(s), e.g. {skipped[0][0]} ({skipped[0][1]})")
        manifest.update({key: settings[key] for key in ("images_per_shard", "files")})
        write_text(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1) + "\n")
        os.remove(os.path.join(out, PROGRESS))
        return manifest


def digest(files):
    """A short digest of an ordered file list: a rerun on a folder whose images changed is told apart."""
    return hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()[:16]
