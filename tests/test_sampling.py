"""``limit`` keeps a seeded, class-balanced sample (vit_keras.data.sampling) and says what it kept."""

import numpy as np
import pytest
from PIL import Image

from vit_keras.data.datasets import load_dataset
from vit_keras.data.sampling import balanced_indices, describe


def test_a_limit_is_shared_evenly_and_a_short_class_gives_its_share_to_the_others():
    labels = np.repeat([0, 1, 2], [50, 50, 4])  # class 2 has only 4 images
    kept = balanced_indices(labels, 30, seed=1)
    assert list(np.bincount(labels[kept])) == [13, 13, 4] and list(kept) == sorted(kept)
    assert np.array_equal(kept, balanced_indices(labels, 30, seed=1))  # seeded
    assert not np.array_equal(kept, balanced_indices(labels, 30, seed=2))
    assert sorted(np.bincount(labels[balanced_indices(labels, 31, seed=0)]))[1:] == [13, 14]
    assert len(balanced_indices(labels, 500)) == len(labels)
    assert describe(labels, kept, ["a", "b", "c"], 30, 1).endswith("kept 30 of 104 images, a 13, b 13, c 4")


def test_a_limit_on_sorted_split_folders_keeps_every_class(tmp_path, capsys):
    """The issue's case: train/ and test/ folders, where the first N sorted files are a class or two."""
    for split in ("train", "test"):
        for name in ("ant", "bee", "cat", "dog"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(6):
                Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / split / name / f"{i}.png")
    for split in ("train", "test"):
        data = load_dataset(f"folder:{tmp_path}", split, limit=8, seed=0)
        assert list(np.bincount(data.labels)) == [2, 2, 2, 2]
    assert "kept 8 of 24 images, 2 of each of 4 classes" in capsys.readouterr().out


@pytest.mark.parametrize("limit", [10, 25])
def test_fashion_mnist_limit_is_balanced(limit):
    data = load_dataset("fashion_mnist", "test", limit=limit)
    counts = np.bincount(data.labels, minlength=10)
    assert counts.sum() == limit and counts.max() - counts.min() <= 1
