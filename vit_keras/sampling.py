"""``limit``: a seeded, class-balanced sample of a split, and the line that says what it kept.

Every class gets an equal share of the ``limit`` (the remainder to classes drawn by the seed); a class with fewer
images than its share gives them all, and its unused share goes to the others. Within a class the images are
drawn by the seed. The kept indices stay in the split's order.
"""

import numpy as np

SHOWN_CLASSES = 12  # the per-class counts a report lists by name


def balanced_indices(labels, limit, seed=0):
    """Sorted indices of at most ``limit`` examples of ``labels`` (int array), as even over the classes as they
    allow, drawn with ``seed``."""
    labels = np.asarray(labels)
    if limit is None or limit >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    members = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)}
    quota = dict.fromkeys(members, 0)
    left = int(limit)
    while left:  # deal the limit out class by class, skipping the classes that ran out
        open_classes = [c for c in members if quota[c] < len(members[c])]
        share, extra = divmod(left, len(open_classes))
        lucky = set(rng.choice(open_classes, extra, replace=False).tolist()) if extra else set()
        for c in open_classes:
            grant = min(share + (c in lucky), len(members[c]) - quota[c])
            quota[c] += grant
            left -= grant
    return np.sort(np.concatenate([members[c][:quota[c]] for c in members]))


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
