"""``limit``: a seeded, class-balanced sample of a split, and the line that says what it kept.

Every class gets an equal share of the ``limit`` (the remainder to classes drawn by the seed); a class with fewer
images than its share gives them all, and its unused share goes to the others. Within a class the images are
drawn by the seed. The kept indices stay in the split's order.
"""

import numpy as np

SHOWN_CLASSES = 12  # the per-class counts a report lists by name


def balanced_order(labels, seed=0):
    """Every index of ``labels``, ordered so that each prefix is as even over the classes as they allow: rounds
    of one image a class, the classes in a seeded order each round, each class's images in a seeded order."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    rank = np.empty(len(labels), np.int64)  # an image's place in its class's seeded order
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rank[members] = rng.permutation(len(members))
    classes = np.unique(labels, return_inverse=True)[1]
    turn = rng.random((int(rank.max(initial=0)) + 1, int(classes.max(initial=0)) + 1))  # each round's class order
    return np.lexsort((turn[rank, classes], rank))


def balanced_indices(labels, limit, seed=0):
    """Sorted indices of at most ``limit`` examples of ``labels``, as even over the classes as they allow (a
    class with fewer images than its share gives them all, the others share the rest), drawn with ``seed``."""
    if limit is None or limit >= len(labels):
        return np.arange(len(labels))
    return np.sort(balanced_order(labels, seed)[:int(limit)])


def describe(labels, kept, class_names, limit, seed):
    """One line: how many images of each class a limit kept."""
    counts = np.bincount(np.asarray(labels)[kept], minlength=len(class_names))
    present = [(name, int(n)) for name, n in zip(class_names, counts) if n]
    if len({n for _, n in present}) == 1:
        per_class = f"{present[0][1]:,} of each of {len(present)} classes"
    else:
        listed = ", ".join(f"{name} {n:,}" for name, n in present[:SHOWN_CLASSES])
        per_class = listed + (f", ... ({len(present)} classes)" if len(present) > SHOWN_CLASSES else "")
    return (f"limit {limit:,} (seed {seed}, class-balanced): kept {len(kept):,} of {len(labels):,} images, "
            f"{per_class}")


def apply_limit(labels, limit, seed, class_names, log=print):
    """``balanced_indices``, with the ``describe`` line sent to ``log`` where the limit left images out."""
    kept = balanced_indices(labels, limit, seed)
    if len(kept) < len(labels):
        log(describe(labels, kept, class_names, limit, seed))
    return kept


def tfds_kept(builder, split, keys, candidates, limit, seed):
    """The indices of a tfds ``split`` to decode (None: all): ``candidates`` (a seeded part of a train-only dataset,
    or None for all), then a class-balanced ``limit`` of them, chosen from the labels alone (images undecoded)."""
    if limit is None:
        return None if candidates is None else set(candidates.tolist())
    import tensorflow_datasets as tfds

    dataset = builder.as_dataset(split=split, shuffle_files=False, decoders={keys[0]: tfds.decode.SkipDecoding()})
    labels = np.fromiter((int(example[keys[1]]) for example in tfds.as_numpy(dataset)), np.int64)
    candidates = np.arange(len(labels)) if candidates is None else np.sort(candidates)
    names = getattr(builder.info.features[keys[1]], "names", None) or [str(i) for i in range(labels.max() + 1)]
    return set(candidates[apply_limit(labels[candidates], limit, seed, names)].tolist())
