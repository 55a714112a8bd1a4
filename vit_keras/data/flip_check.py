"""Does a horizontal flip keep an image's label? A check on the training data, before training starts.

Flips are the cheapest augmentation, and wrong for digits, text and anything whose orientation carries meaning.
The check is a nearest-neighbour probe on a seeded part of the training split: small gray thumbnails of held-out
images are classified by their nearest training image, once among the training images as they are and once among
the same images flipped. Where flips keep labels, a flipped image still has near neighbours of its own class (a
flipped shirt is a shirt), so the second accuracy stays a good part of the first; where they change labels, it
collapses towards chance (a mirrored 2 is not a 2). docs/benchmarks.md has the measured values behind the threshold.
"""

import numpy as np

from vit_keras.constants import LUMA_WEIGHTS

# Flips are taken as label-preserving when nearest neighbours among flipped images keep at least this share of
# the plain nearest-neighbour accuracy.
MIN_FLIP_CONSISTENCY = 0.6
THUMBNAIL_SIDE = 16
MAX_PROBE_IMAGES = 10_000
STREAM_PROBE_IMAGES = 2_000  # the images decoded for the check where the data streams from disk
THUMBNAIL_CHUNK = 64


def thumbnails(images, side=THUMBNAIL_SIDE, flip=False, rows=None, chunk=THUMBNAIL_CHUNK):
    """(N, side * side) float32 gray thumbnails, each centred on its mean (brightness does not decide), of
    ``images`` (those at ``rows``, in that order; flipped left-right first with ``flip``), a ``chunk`` at a time:
    the gray conversion works in float64, which for 2,000 images at 224 px would be 0.8 GB at once."""
    from PIL import Image

    images = np.asarray(images)
    images = images[..., None] if images.ndim == 3 else images
    rows = np.arange(len(images)) if rows is None else np.asarray(rows)
    out = np.empty((len(rows), side * side), np.float32)
    for start in range(0, len(rows), chunk):
        part = images[rows[start:start + chunk]]
        part = part[:, :, ::-1] if flip else part
        gray = part[..., 0] if part.shape[-1] == 1 else np.clip(part[..., :3] @ np.array(LUMA_WEIGHTS), 0, 255)
        for i, image in enumerate(gray.astype(np.uint8)):
            out[start + i] = np.asarray(Image.fromarray(image).resize((side, side), Image.BILINEAR), np.float32).ravel()
    out /= 255.0
    return out - out.mean(axis=1, keepdims=True)


def nearest_neighbour_accuracy(train, train_labels, queries, query_labels, chunk=1024):
    """Top-1 accuracy of 1-nearest-neighbour (Euclidean) classification of ``queries``."""
    norms = (train**2).sum(axis=1)
    hits = 0
    for start in range(0, len(queries), chunk):
        q = queries[start:start + chunk]
        nearest = (norms[None] - 2.0 * q @ train.T).argmin(axis=1)  # |q|^2 is the same for every candidate
        hits += int(np.sum(train_labels[nearest] == query_labels[start:start + chunk]))
    return hits / len(queries)


def flip_consistency(images, labels, seed=0, max_images=MAX_PROBE_IMAGES, held_out=0.2):
    """``(plain, flipped)`` nearest-neighbour accuracies of held-out images: among the training part as it is,
    and among the training part flipped left-right."""
    images, labels = np.asarray(images), np.asarray(labels)
    if len(images) < 10 or len(images) != len(labels):
        raise ValueError(f"The flip check needs >= 10 labelled images; got {len(images)} images and "
                         f"{len(labels)} labels.")
    order = np.random.default_rng(seed).permutation(len(images))[:max_images]
    labels = labels[order]
    split = len(order) - max(int(len(order) * held_out), 1)
    plain = thumbnails(images, rows=order)
    flipped = thumbnails(images, rows=order[:split], flip=True)  # only the training part is looked up flipped
    train_labels, query_labels = labels[:split], labels[split:]
    queries = plain[split:]
    return (nearest_neighbour_accuracy(plain[:split], train_labels, queries, query_labels),
            nearest_neighbour_accuracy(flipped, train_labels, queries, query_labels))


def flips_keep_labels(images, labels, seed=0):
    """``(keep, plain, flipped)``: whether flips look label-preserving on this data, and the two accuracies."""
    plain, flipped = flip_consistency(images, labels, seed)
    return flipped >= MIN_FLIP_CONSISTENCY * plain, plain, flipped


def describe(plain, flipped):
    return (f"nearest-neighbour accuracy {100 * plain:.1f}% among training images, {100 * flipped:.1f}% among "
            f"them flipped ({flipped / plain if plain else 0:.2f} of it; flips count as label-preserving from "
            f"{MIN_FLIP_CONSISTENCY:.2f})")
