"""keras-hub ViT presets load through the same loader: the fixture folder (scripts/make_kerashub_fixture.py: a tiny
random ViTImageClassifier saved by keras-hub 0.32's save_to_preset) gives keras-hub's own logits."""

import os
import shutil

import numpy as np
import pytest

import vit_keras
import weight_checkpoints as wc
from vit_keras.weights import loader as weights
from vit_keras.weights.keras_hub import keras_hub_arguments
from vit_keras.weights.normalization import checkpoint_normalization

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "kerashub_vit")
TOLERANCE = 1e-5


def expected(folder=FOLDER):
    with np.load(os.path.join(folder, "expected.npz")) as data:
        return data["logits"], wc.images(32, int(data["image_seed"]))


@pytest.mark.parametrize("folder", [FOLDER, FOLDER + "_pre_logits"])
def test_a_keras_hub_preset_folder_gives_keras_hubs_logits(folder):
    arguments = keras_hub_arguments(folder)
    assert arguments["num_classes"] == 5 and arguments["hidden_size"] == 16 and arguments["num_layers"] == 2
    assert arguments["representation_size"] == (8 if folder.endswith("_pre_logits") else None)
    model = vit_keras.create_model("vit_b16", weights=folder, include_preprocessing=False, **arguments)
    logits, x = expected(folder)
    assert float(np.abs(np.asarray(model(x)) - logits).max()) <= TOLERANCE


def test_its_image_converter_is_the_checkpoint_normalization():
    assert checkpoint_normalization(FOLDER) == ([0.5], [0.5])  # keras-hub's scale 1/127.5, offset -1
    model = vit_keras.create_model("vit_b16", weights=FOLDER, include_preprocessing=True, pixel_mean="checkpoint",
                                   **keras_hub_arguments(FOLDER))
    logits, x = expected()
    pixels = (x + 1.0) * 127.5  # the 0-255 pixels keras-hub's converter maps to x
    assert float(np.abs(np.asarray(model(pixels)) - logits).max()) <= 1e-4


def test_a_backbone_alone_fine_tunes_with_a_zero_head(tmp_path):
    backbone = tmp_path / "backbone"
    shutil.copytree(FOLDER, backbone, ignore=shutil.ignore_patterns("task.*"))
    arguments = dict(keras_hub_arguments(str(backbone)), num_classes=3)
    with pytest.warns(UserWarning, match="no classification head"):
        model = vit_keras.create_model("vit_b16", weights=str(backbone), **arguments)
    assert not np.any(np.asarray(model.head.kernel))
    same = weights.model_arrays(vit_keras.create_model("vit_b16", weights=FOLDER, **keras_hub_arguments(FOLDER)))
    tuned = weights.model_arrays(model)
    assert all(np.array_equal(same[name], tuned[name]) for name in tuned if not name.startswith("head/"))


def test_a_folder_without_weights_names_what_it_looks_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="nor a keras-hub preset"):
        weights.load_weights(vit_keras.create_model("vit_b16", **keras_hub_arguments(FOLDER)), str(tmp_path))


def test_train_fine_tunes_a_keras_hub_folder_with_the_shape_its_config_gives(tmp_path, capsys):
    from vit_keras.training import train

    record = train.train("fashion_mnist", str(tmp_path), weights=FOLDER, limit=128, epochs=1, batch_size=64,
                         image_size=32, jit_compile=False, verbose=0, tensorboard=False)
    assert record["recipe"] == "finetune" and record["vit"]["hidden_size"] == 16 and record["vit"]["channels"] == 1
    out = capsys.readouterr().out
    assert "recipe: finetune, because the weights are pretrained" in out
    from vit_keras.cpu import cpu_features  # the log names the CPU's units and the precision it trains in

    assert f"{cpu_features().describe()}; precision float32" in out
