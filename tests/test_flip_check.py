"""The flip rule: a nearest-neighbour probe on the training data says whether left-right flips keep labels."""

import numpy as np
import pytest

from vit_keras.data import flip_check


def test_clothes_keep_their_labels_when_flipped(fashion_train):
    images, labels = fashion_train
    keep, plain, flipped = flip_check.flips_keep_labels(images[:10_000], labels[:10_000])
    assert keep and plain > 0.75 and flipped >= flip_check.MIN_FLIP_CONSISTENCY * plain


def test_digits_do_not():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)  # 8x8, 0-16 -> 0-255
    keep, plain, flipped = flip_check.flips_keep_labels(images, digits.target)
    assert not keep and plain > 0.9 and flipped < 0.5 * plain
    assert "flipped" in flip_check.describe(plain, flipped)


def test_a_symmetric_toy_set_keeps_and_a_mirrored_one_does_not():
    rng = np.random.default_rng(0)
    left = np.zeros((100, 12, 12), np.uint8)
    left[:, :, :4] = 255  # a bar on the left
    noisy = lambda x: np.clip(x.astype(int) + rng.integers(0, 40, x.shape), 0, 255).astype(np.uint8)  # noqa: E731
    # classes told apart by a left vs a right bar: a flip turns one into the other
    images = noisy(np.concatenate([left, left[:, :, ::-1]]))
    labels = np.repeat([0, 1], 100)
    assert not flip_check.flips_keep_labels(images, labels)[0]
    # classes told apart by a top vs a bottom bar: a flip changes nothing
    top = np.zeros((100, 12, 12), np.uint8)
    top[:, :4] = 255
    images = noisy(np.concatenate([top, top[:, ::-1]]))
    assert flip_check.flips_keep_labels(images, labels)[0]


def test_too_few_images_is_a_clear_error():
    with pytest.raises(ValueError, match=">= 10 labelled images"):
        flip_check.flips_keep_labels(np.zeros((3, 8, 8), np.uint8), np.zeros(3, np.int64))


def digits_data():
    from sklearn.datasets import load_digits

    from vit_keras.data.datasets import ArrayDataset

    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)[..., None]
    return ArrayDataset(images, digits.target.astype(np.int64), [str(d) for d in range(10)])


def test_training_turns_the_recipes_flips_off_on_digits_and_warns_when_asked(capsys):
    from vit_keras.training.train import choose_flips
    from vit_keras.training.config import TrainConfig

    data = digits_data()
    assert TrainConfig("folder:x").augment == "flip"  # the recipe's default
    assert choose_flips(TrainConfig("folder:x"), data) is False
    assert "flips off" in capsys.readouterr().out
    assert choose_flips(TrainConfig("folder:x", augment="flip"), data) is True  # asked for: kept, with a warning
    out = capsys.readouterr().out
    assert "warning: `augment`='flip'" in out and "among them flipped" in out
    assert choose_flips(TrainConfig("folder:x", augment="none"), data) is False
    assert "from_recipe" not in TrainConfig.option_names()


def test_training_keeps_flips_on_clothes(fashion_train, capsys):
    from vit_keras.data.datasets import ArrayDataset
    from vit_keras.training.train import choose_flips
    from vit_keras.training.config import TrainConfig

    images, labels = fashion_train[:2]
    data = ArrayDataset(images[:5000], labels[:5000], [str(i) for i in range(10)])
    assert choose_flips(TrainConfig("fashion_mnist"), data) is True
    assert capsys.readouterr().out == ""
