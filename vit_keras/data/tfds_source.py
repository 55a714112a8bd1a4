"""tfds datasets as in-memory arrays (``vit_keras.data.datasets.load_dataset``'s "tfds:NAME")."""

import numpy as np

from vit_keras.data.arrays import ArrayDataset, split_indices, stack_images
from vit_keras.data.sampling import tfds_kept


def load_tfds(name, split, data_dir, seed=0, val_fraction=0.1, limit=None):
    """An ``ArrayDataset`` of a tfds dataset's split (see ``vit_keras.data.datasets``)."""
    if not name:
        raise ValueError("`data`='tfds:NAME' needs a dataset name, e.g. 'tfds:cifar10'.")
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # tfds raises DatasetNotFoundError and friends
        raise FileNotFoundError(f"tfds dataset {name!r} not found: {error}") from None
    if not builder.is_prepared():
        try:
            builder.download_and_prepare()
        except Exception as error:
            raise FileNotFoundError(
                f"tfds dataset {name!r} is not prepared in {builder.data_dir!r} and could not be downloaded "
                f"({type(error).__name__}: {error}). Prepare it with `tfds build {name}` or pass data_dir."
            ) from None
    splits = builder.info.splits
    candidates = None  # a train-only dataset: "val"/"test" are a seeded part of train, which keeps the rest
    tfds_split = split
    if split == "val":
        tfds_split = "validation" if "validation" in splits else "test"
    if split == "test" and "test" not in splits:
        tfds_split = "validation"
    if list(splits) == ["train"]:
        train, val = split_indices(splits["train"].num_examples, seed, val_fraction)
        candidates, tfds_split = (train if split == "train" else val), "train"
    if tfds_split not in splits:
        raise ValueError(f"tfds dataset {name!r} has no {split!r} split; it has {', '.join(splits)}.")
    keys = builder.info.supervised_keys
    if not keys:
        raise ValueError(f"tfds dataset {name!r} has no (image, label) supervised keys.")
    image_key, label_key = keys[0], keys[1]
    wanted = tfds_kept(builder, tfds_split, keys, candidates, limit, seed)  # None: all of the split
    images, labels = [], []
    for index, example in enumerate(tfds.as_numpy(builder.as_dataset(split=tfds_split, shuffle_files=False))):
        if wanted is None or index in wanted:
            images.append(ensure_hwc(np.asarray(example[image_key])))
            labels.append(int(example[label_key]))
    if not images:
        raise ValueError(f"tfds dataset {name!r} split {tfds_split!r} is empty.")
    images = stack_images(images, target_size=None)
    label_feature = builder.info.features[label_key]
    num_classes = getattr(label_feature, "num_classes", None) or max(labels) + 1
    names = getattr(label_feature, "names", None) or [str(i) for i in range(num_classes)]
    return ArrayDataset(images, np.asarray(labels, np.int64), list(names))


def ensure_hwc(image):
    if image.ndim == 2:
        image = image[..., None]
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    return image
