"""The Keras user's path: ``finetune_recipe`` (the CLI's recipe as Keras objects), ``image_dataset``, a model that
says which input it takes and refuses the other, ``predict(top_k=)`` and class names that travel with the model."""

import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import vit_keras
from vit_keras.training.building import compile_for_fit
from vit_keras.training.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(image_size=32, num_classes=3, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1)
CLASSES = ["cat", "dog", "fox"]


def tiny_model(**kwargs):
    return vit_keras.create_model("vit_ti16", **{**TINY, **kwargs})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Class folders of 3 x 12 small PNGs, each class its own colour (learnable), sizes mixed."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        os.makedirs(root / name)
        for i in range(12):
            image = rng.integers(0, 60, (40, 40 + 8 * (i % 2), 3), dtype=np.uint8)
            image[..., label] += 180
            Image.fromarray(image).save(root / name / f"{i}.png")
    return str(root)


def test_recipe_is_the_cli_recipe():
    model = tiny_model()
    recipe = vit_keras.finetune_recipe(model, 50_000, image_size=32)
    config = TrainConfig("fashion_mnist", model_name="vit_ti16", weights="w.npz", image_size=32)
    assert (recipe.optimizer, recipe.batch_size, recipe.epochs, recipe.weight_decay, recipe.label_smoothing) == (
        config.optimizer, config.batch_size, config.epochs, config.weight_decay, config.label_smoothing)
    assert recipe.learning_rate == pytest.approx(0.02) and recipe.optimizer == "sgd"
    assert recipe.steps_per_epoch == 50_000 // 64 and recipe.warmup_steps == int(recipe.steps_per_epoch * 0.5)
    assert recipe.augmentation.augment == "crop" and recipe.augmentation.flips
    # The CLI compiles through the same Recipe: the same optimizer, schedule and loss.
    cli_model = tiny_model()
    compile_for_fit(cli_model, config, recipe.steps_per_epoch)
    mine = recipe.compile(tiny_model())
    named = lambda optimizer: {**optimizer.get_config(), "name": None}  # noqa: E731 (Keras numbers the names)
    assert named(mine.optimizer) == named(cli_model.optimizer)
    assert mine.loss.get_config() == cli_model.loss.get_config()
    assert "SGD (momentum 0.9) at peak LR 0.02" in str(recipe)


def test_a_recipe_with_patch_dropout_gives_its_model_the_rate_and_sizes_its_steps_by_the_kept_tokens():
    """``patch_dropout`` travels from the options to the Recipe, to the model ``prepare`` returns (its weights
    kept) and to the memory budget, which counts the tokens a training step keeps."""
    model = vit_keras.create_model("vit_ti16", image_size=224, num_classes=3)
    plain, dropping = (vit_keras.finetune_recipe(model, 1_000, image_size=224, patch_dropout=rate)
                       for rate in (0.0, 0.5))
    assert (plain.patch_dropout, dropping.patch_dropout) == (0.0, 0.5) and "patch dropout 0.5" in str(dropping)
    assert dropping.accumulation < plain.accumulation  # half the tokens: about half the activations a step
    small = tiny_model()
    prepared = dataclasses.replace(dropping, image_size=(32, 32)).prepare(small)
    assert prepared.vit_config["patch_dropout"] == 0.5 and prepared.patch_dropout_layer.rate == 0.5
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(prepared.head.kernel),
                                  keras.ops.convert_to_numpy(small.head.kernel))
    with pytest.raises(ValueError, match="`patch_dropout` must be in \\[0, 1\\)"):
        vit_keras.finetune_recipe(small, 100, image_size=32, patch_dropout=-0.1)
def test_recipe_options_are_checked_and_counted(folder):
    model = tiny_model()
    recipe = vit_keras.finetune_recipe(model, folder, image_size=32, epochs=5, learning_rate=0.01, augment="flip",
                                       batch_size=16)
    assert (recipe.epochs, recipe.learning_rate, recipe.augmentation.augment) == (5, 0.01, "flip")
    assert recipe.steps_per_epoch == 2  # 36 images in batches of 16 (epochs asked for: no step floor)
    with pytest.raises(ValueError, match="`batch_size`=64 is larger than the 36 training images"):
        vit_keras.finetune_recipe(model, folder, image_size=32, epochs=5)
    with pytest.raises(TypeError, match="epoch.*epochs"):
        vit_keras.finetune_recipe(model, 100, image_size=32, epoch=3)
    with pytest.raises(ValueError, match="`learning_rate`"):
        vit_keras.finetune_recipe(model, 100, image_size=32, learning_rate=-1)
    with pytest.raises(ValueError, match="`train_data`"):
        vit_keras.finetune_recipe(model, 0, image_size=32)
    with pytest.raises(ValueError, match="`model` must be a vit_keras VisionTransformer"):
        vit_keras.finetune_recipe(keras.Sequential([keras.layers.Dense(2)]), 100)


def test_recipe_chooses_the_size_by_a_warm_up():
    model = tiny_model(image_size=64)
    recipe = vit_keras.finetune_recipe(model, 256, 64)
    assert recipe.image_size == (64, 64)  # a tiny model: its own size is well within the time
    assert "measured by a" in recipe.why and recipe.estimated_seconds > 0
    table = vit_keras.finetune_recipe(model, 256, measure=False)
    assert table.image_size == (64, 64) and "estimated from" in table.why


def test_finetune_in_a_few_lines(folder):
    model = tiny_model()
    recipe = dataclasses.replace(vit_keras.finetune_recipe(model, folder, image_size=32, epochs=12, batch_size=12),
                                 learning_rate=0.05)
    train = vit_keras.image_dataset(folder, recipe, training=True)
    val = vit_keras.image_dataset(folder, recipe)
    assert isinstance(train, tf.data.Dataset) and train.class_names == CLASSES and train.num_images == 36
    model = recipe.prepare(model, train.class_names)
    history = model.fit(train, validation_data=val, epochs=recipe.epochs, verbose=0)
    assert len(history.history["loss"]) == 12 and history.history["val_accuracy"][-1] > 0.6
    assert model.class_names == CLASSES
    top = vit_keras.predict(model, val, top_k=2)
    assert top.labels.shape == (36, 2) and set(top.labels[:, 0]) <= set(CLASSES)
    assert np.all(top.scores[:, 0] >= top.scores[:, 1]) and np.all(top.scores.sum(1) <= 1 + 1e-6)


def test_image_dataset_batches(folder):
    recipe = vit_keras.finetune_recipe(tiny_model(), 200, image_size=32, batch_size=8)  # the step floor repeats
    train = vit_keras.image_dataset(folder, recipe, training=True)
    batches = list(train)
    assert len(batches) == recipe.fit_steps_per_epoch > 36 // 8  # more than one pass: the data repeats
    x, y = batches[0]
    assert x.shape == (8, 32, 32, 3) and x.dtype == tf.float32 and y.shape == (8, 3)
    assert 0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 255
    val = list(vit_keras.image_dataset(folder, recipe))
    assert sum(len(b[0]) for b in val) == 36  # in order, the last batch kept


def test_streamed_passes_differ(folder):
    data = vit_keras.image_dataset(folder, batch_size=6, image_size=32, training=True, input_mode="stream")
    first, second = ([int(tf.argmax(label)) for _, y in data for label in y] for _ in range(2))
    assert len(first) == len(second) == 36 and first != second  # a fresh order each pass


def test_image_dataset_from_arrays_and_tf_data():
    images = np.random.default_rng(0).integers(0, 255, (10, 16, 16, 3), dtype=np.uint8)
    labels = np.arange(10) % 2
    from_arrays = vit_keras.image_dataset((images, labels), batch_size=4, class_names=["a", "b"])
    assert from_arrays.class_names == ["a", "b"] and sum(len(x) for x, _ in from_arrays) == 10
    examples = tf.data.Dataset.from_tensor_slices((images, labels))
    batches = vit_keras.image_dataset(examples, batch_size=4, class_names=["a", "b"], image_size=24)
    assert [tuple(x.shape) for x, _ in batches] == [(4, 24, 24, 3), (4, 24, 24, 3), (2, 24, 24, 3)]
    with pytest.raises(ValueError, match="`class_names` is needed"):
        vit_keras.image_dataset(examples)
    with pytest.raises(ValueError, match="uint8"):
        vit_keras.image_dataset((images / 255.0, labels))


def test_image_dataset_bad_input(tmp_path):
    with pytest.raises(ValueError, match="neither a folder nor a dataset name"):
        vit_keras.image_dataset(str(tmp_path / "nowhere"))
    os.makedirs(tmp_path / "empty" / "a")
    with pytest.raises(ValueError, match="empty"):
        vit_keras.image_dataset(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="`split`"):
        vit_keras.image_dataset("fashion_mnist", split="dev")


def test_model_states_and_checks_its_input():
    raw, normalized = tiny_model(), tiny_model(include_preprocessing=False)
    assert raw.takes_raw_pixels and "raw 0-255 pixels" in repr(raw)
    assert not normalized.takes_raw_pixels and "normalized pixels in [-1, 1]" in repr(normalized)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    with pytest.raises(ValueError, match=r"`x` holds values in \[-1, 1\].*raw 0-255 pixels"):
        raw.predict(pixels / 127.5 - 1, verbose=0)
    with pytest.raises(ValueError, match="holds values in"):
        vit_keras.predict(raw, pixels / 255.0)
    with pytest.raises(ValueError, match="normalized pixels"):
        normalized.predict(pixels, verbose=0)
    with pytest.raises(ValueError, match="must hold numbers"):
        raw.predict(np.full((1, 32, 32, 3), "x"), verbose=0)
    np.testing.assert_allclose(raw.predict(pixels, verbose=0), raw.predict(pixels.astype("uint8").astype("float32"),
                                                                           verbose=0), atol=1e30)  # accepted


def test_top_k_and_class_names(tmp_path):
    model = tiny_model(class_names=CLASSES)
    pixels = np.random.default_rng(1).uniform(0, 255, (5, 32, 32, 3)).astype("float32")
    logits = vit_keras.predict(model, pixels)
    top = vit_keras.predict(model, pixels, top_k=3)
    np.testing.assert_array_equal(top.indices[:, 0], logits.argmax(1))
    assert top.labels[0, 0] == CLASSES[logits[0].argmax()] and top.rows()[0][0][0] == top.labels[0, 0]
    np.testing.assert_allclose(top.scores.sum(1), 1, rtol=1e-5)
    with pytest.raises(ValueError, match="`top_k` must be an int from 1 to the model's 3 classes; got 4"):
        vit_keras.predict(model, pixels, top_k=4)
    model.save(tmp_path / "m.keras")
    assert vit_keras.load_model(tmp_path / "m.keras").class_names == CLASSES
    assert model.rebuild(num_classes=4).class_names is None  # a new head: its classes are new
    with pytest.raises(ValueError, match="`class_names` has 2 names"):
        tiny_model(class_names=["a", "b"])
    assert vit_keras.predict(tiny_model(), pixels, top_k=1).labels[0, 0].startswith("class ")


def test_preset_typo_names_the_nearest():
    with pytest.raises(ValueError, match="vit_tiny_patch16_224.augreg_in21k_ft_in1k"):
        vit_keras.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1", num_classes=10)


JAX_SCRIPT = """
import json, sys, vit_keras
model = vit_keras.create_model("vit_ti16", image_size=32, num_classes=3, hidden_size=32, num_heads=2, mlp_dim=64,
                               num_layers=1)
recipe = vit_keras.finetune_recipe(model, sys.argv[1], image_size=32, epochs=2, batch_size=12)
train = vit_keras.image_dataset(sys.argv[1], recipe, training=True)
model = recipe.prepare(model, train.class_names)
history = model.fit(train, validation_data=vit_keras.image_dataset(sys.argv[1], recipe), epochs=recipe.epochs,
                    verbose=0)
print(json.dumps(dict(kind=type(train).__name__, epochs=len(history.history["loss"]), names=model.class_names)))
"""


def test_the_same_code_under_jax(folder):
    pytest.importorskip("jax")
    done = subprocess.run([sys.executable, "-c", JAX_SCRIPT, folder], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == dict(kind="ArrayBatches", epochs=2, names=CLASSES)


def test_flips_that_change_labels_are_turned_off(capsys):
    """Left-bright images are class 0, right-bright class 1: flips swap the classes, so the recipe drops them, as
    the CLI's flip rule does."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 40, (64, 16, 16, 3), dtype=np.uint8)
    labels = np.arange(64) % 2
    for image, label in zip(images, labels):
        image[:, slice(0, 8) if label == 0 else slice(8, 16)] += 200
    recipe = vit_keras.finetune_recipe(tiny_model(), (images, labels), image_size=32, batch_size=16)
    assert not recipe.augmentation.flips and "flips off" in capsys.readouterr().out
    turned = np.ascontiguousarray(np.swapaxes(images, 1, 2))  # top-bright and bottom-bright: flips keep the labels
    assert vit_keras.finetune_recipe(tiny_model(), (turned, labels), image_size=32, batch_size=16).augmentation.flips


def test_export_reads_the_models_class_names(tmp_path):
    from vit_keras.apps.classifier import Classifier
    from vit_keras.convert.export import export_tflite

    model = tiny_model(class_names=CLASSES)
    model.save(tmp_path / "m.keras")
    export_tflite(str(tmp_path / "m.keras"), str(tmp_path / "m.tflite"))  # no labels.txt beside it
    assert Classifier(str(tmp_path / "m.tflite")).info.labels == CLASSES
