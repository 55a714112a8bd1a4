"""vit_keras.training.distill: DeiT's hard-label distillation from a small CNN, in both input pipelines and in train()."""

import json
import re

import keras
import numpy as np
import pytest

from vit_keras.training import distill
from vit_keras.training import runs
from vit_keras.training import train
from vit_keras.data.array_pipeline import make_batches
from vit_keras.data.augmentation import Augmentation
from vit_keras.data.pipeline import make_dataset

TINY = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1)


@pytest.fixture(scope="module")
def teacher():
    keras.utils.set_random_seed(0)
    return distill.small_cnn((28, 28, 1), 10)


@pytest.fixture(scope="module")
def batch(fashion_train):
    images, labels = fashion_train
    return images[:64], labels[:64]


def test_hard_targets_average_the_labels_and_the_teachers_argmax():
    labels = np.array([[1.0, 0.0, 0.0], [0.2, 0.8, 0.0]], "float32")  # the second mixed by MixUp
    logits = np.array([[0.1, 0.0, 3.0], [-1.0, 2.0, 0.5]], "float32")
    targets = keras.ops.convert_to_numpy(distill.hard_targets(labels, logits))
    np.testing.assert_allclose(targets, [[0.5, 0.0, 0.5], [0.1, 0.9, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(targets.sum(-1), 1.0, rtol=1e-6)  # still a distribution for the loss


@pytest.mark.parametrize("pipeline", ["tf.data", "arrays"])
def test_each_augmented_batch_gets_the_teachers_labels_of_the_images_in_it(pipeline, teacher, batch):
    images, labels = batch
    options = dict(num_classes=10, batch_size=32, training=True, augmentation=Augmentation("crop"), seed=3)

    def first(**extra):
        if pipeline == "tf.data":
            x, y = next(iter(make_dataset(images, labels, **options, **extra)))
            return np.asarray(x), np.asarray(y)
        return make_batches(images, labels, **options, **extra)[0]

    (x, y), (x_taught, y_taught) = first(), first(teacher=teacher)
    np.testing.assert_array_equal(x, x_taught)  # the same crops: the teacher labels what the student sees
    expected = 0.5 * y + 0.5 * np.eye(10)[keras.ops.convert_to_numpy(teacher(x)).argmax(-1)]
    np.testing.assert_allclose(y_taught, expected, atol=1e-6)
    assert not np.allclose(y, y_taught)  # an untrained teacher disagrees with some labels


def test_the_teacher_needs_one_hot_labels_and_evaluation_ignores_it(teacher, batch):
    images, labels = batch
    with pytest.raises(ValueError, match=re.escape("`teacher` mixes its labels into the targets, so it needs "
                                                   "`one_hot=True`.")):
        make_dataset(images, labels, 10, training=True, one_hot=False, teacher=teacher)
    plain = make_batches(images, labels, 10, batch_size=32, teacher=teacher)  # evaluation: the data's labels
    np.testing.assert_array_equal(plain[0][1], np.eye(10)[labels[:32]])


def test_auto_distills_the_recipes_vit_on_small_data_only():
    quick = train.TrainConfig("fashion_mnist")
    assert quick.distill == "auto" and quick.teacher_steps == train.RECIPES["quick"]["teacher_steps"]
    assert quick.distills(1000)  # the step floor repeats the data
    assert not quick.distills(54_000)  # one pass an epoch
    assert not train.TrainConfig("fashion_mnist", epochs=5).distills(1000)  # no floor: epochs as asked
    assert not train.TrainConfig("fashion_mnist", model_name="vit_ti16").distills(1000)  # a named model
    assert not train.TrainConfig("fashion_mnist", weights="run/model.keras").distills(1000)  # fine-tuning
    assert train.TrainConfig("fashion_mnist", distill="cnn").distills(54_000)
    assert not train.TrainConfig("fashion_mnist", distill="none").distills(1000)


@pytest.mark.parametrize("options, message", [
    (dict(distill="deit"), "Unknown `distill`='deit'; valid values are 'auto', 'cnn', 'none'."),
    (dict(teacher_steps=0), "`teacher_steps` must be a positive int; got 0."),
])
def test_bad_distillation_settings_fail_before_anything_is_written(options, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        train.train("fashion_mnist", str(tmp_path / "run"), **options)
    assert not (tmp_path / "run").exists()


def test_a_distilling_run_trains_its_teacher_first_and_keeps_it_for_a_resume(tmp_path, capsys):
    kw = dict(limit=128, batch_size=32, epochs=2, min_steps=10, teacher_steps=6, jit_compile=False, verbose=0,
              tensorboard=False, model_overrides=TINY)
    config = train.train("fashion_mnist", str(tmp_path), **kw)  # 4 batches a pass: the floor repeats the data
    out = capsys.readouterr().out
    assert re.search(r"teacher: small CNN \([\d,]+ parameters\), 6 steps in \d+ s, [\d.]+% on the validation "
                     r"images", out)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["distill"], written["teacher_steps"], written["augment"]) == ("cnn", 6, "crop")
    assert config["completed"] and keras.saving.load_model(tmp_path / "model.keras").input_shape == \
        (None, 32, 32, 1)  # the ViT is the run's model; the teacher is beside it
    saved = keras.saving.load_model(tmp_path / runs.TEACHER_FILE, safe_mode=True)
    assert saved.name == "small_cnn"

    def fail():
        raise AssertionError("a resumed run trains no second teacher")

    again = distill.run_teacher(str(tmp_path), fail)
    assert "the run's own" in capsys.readouterr().out
    for mine, theirs in zip(again.weights, saved.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    runs.clear_run(str(tmp_path))  # another run in this folder: its teacher goes too
    assert not (tmp_path / runs.TEACHER_FILE).exists()
