"""Named presets: the registry's facts, create_model(PRESET) end to end through a mirror on 127.0.0.1, and the
errors: an unknown name names the nearest, a preset with another architecture is refused naming both."""

import os
import re
import urllib.parse

import numpy as np
import pytest

import vit_keras
from vit_keras.weights import loader as weights
from vit_keras.weights import fetch as weights_fetch
from vit_keras.weights import presets as weights_presets
from vit_keras.apps import cli
from vit_keras.constants import NORMALIZATIONS
from vit_keras.models.configs import MODELS
from vit_keras.training.config import TrainConfig
from weight_server import WeightServer

TINY = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
# The releases the registry must hold (timm's names).
REQUIRED = [f"{arch}.orig_in21k" for arch in ("vit_base_patch16_224", "vit_base_patch32_224", "vit_large_patch16_224",
                                              "vit_large_patch32_224", "vit_huge_patch14_224", "vit_base_r50_s16_224")]
REQUIRED += [f"{arch}.orig_in21k_ft_in1k" for arch in ("vit_base_patch16_224", "vit_base_patch16_384",
                                                        "vit_base_patch32_384", "vit_large_patch16_224",
                                                        "vit_large_patch16_384", "vit_large_patch32_384",
                                                        "vit_base_r50_s16_384")]
REQUIRED += [f"{arch}.{tag}" for arch in ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_small_patch32_224",
                                          "vit_base_patch16_224", "vit_base_patch32_224", "vit_large_patch16_224",
                                          "vit_small_r26_s32_224") for tag in ("augreg_in21k", "augreg_in21k_ft_in1k")]
REQUIRED += ["hf-hub:google/vit-base-patch16-224"]


def test_the_registry_holds_the_public_releases_with_their_facts():
    names = vit_keras.list_presets()
    assert set(REQUIRED) <= set(names) and len(names) == len(set(names))
    aliases = weights_presets.ALIASES
    assert not set(aliases) & set(names)
    assert aliases["vit_base_patch16_224_imagenet"] == "vit_base_patch16_224.orig_in21k_ft_in1k"  # keras-hub's
    assert aliases["google/vit-base-patch16-224"] == "hf-hub:google/vit-base-patch16-224"
    for preset in weights_presets.PRESETS:
        assert preset.model in MODELS and preset.normalization in NORMALIZATIONS, preset.name
        assert preset.url.startswith("https://") and preset.licence and preset.source, preset.name
        assert preset.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", preset.sha256)
        assert preset.image_size % vit_keras.model_config(preset.model)["patch_size"] == 0
        labels = weights_presets.preset_labels(preset.name)
        assert (labels is None and "no ImageNet-21k label list" in preset.note) or len(labels) == preset.num_classes
        if preset.name.endswith("_in21k"):
            assert preset.num_classes == 21843 and preset.labels is None
    assert weights_presets.get_preset("vit_huge_patch14_224_imagenet21k").representation_size == 1280


def test_an_unknown_preset_names_the_nearest():
    with pytest.raises(ValueError, match="nearest are vit_tiny_patch16_224.augreg_in21k_ft_in1k"):
        vit_keras.get_preset("vit_tiny_patch16_224.augreg_in21k_ft_in")
    with pytest.raises(ValueError, match="Unknown model name 'vit_tiny_patch16'.*nearest: vit_tiny_patch16_224"):
        vit_keras.create_model("vit_tiny_patch16")


@pytest.fixture
def hosted_tiny(tmp_path_factory):
    """A random ViT-Ti/16 (224, 1,000 classes) saved as Google's .npz under the preset's URL path."""
    root = tmp_path_factory.mktemp("hosted")
    source = vit_keras.create_model("vit_ti16", image_size=224, num_classes=1000)
    path = urllib.parse.urlparse(weights_presets.get_preset(TINY).url).path
    target = os.path.join(str(root), *path.lstrip("/").split("/"))
    os.makedirs(os.path.dirname(target))
    weights.save_npz(source, target)
    return str(root), source


def test_create_model_from_a_preset_downloads_through_the_mirror(hosted_tiny, tmp_path, monkeypatch):
    root, source = hosted_tiny
    server = WeightServer(root)
    monkeypatch.setenv("VIT_KERAS_CACHE", str(tmp_path))
    monkeypatch.setenv(weights_fetch.MIRROR_ENV, server.url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    try:
        model = vit_keras.create_model(TINY)
        config = model.vit_config
        assert (config["image_size"], config["num_classes"], config["pixel_mean"]) == ((224, 224), 1000, [0.5] * 3)
        x = np.random.default_rng(0).uniform(-1, 1, (2, 224, 224, 3)).astype("float32")
        assert np.allclose(np.asarray(model(x)), np.asarray(source(x)), atol=1e-5)
        tuned = vit_keras.create_model(TINY, num_classes=3, image_size=64)  # the cached file: no new request
        assert len(server.requests) == 1 and tuned.vit_config["image_size"] == (64, 64)
        assert not np.any(np.asarray(tuned.head.kernel))  # a zero head for the new classes
    finally:
        server.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(name=TINY, patch_size=8), r"is a vit_ti16 and cannot load .*`patch_size`=8 \(the preset's is 16\)"),
    (dict(name="vit_b16", weights=TINY), f"`name`='vit_b16' conflicts with preset '{TINY}'"),
    (dict(name=TINY, weights="other.npz"), "brings its own weights"),
    (dict(name=TINY, pooling="gap"), r"`pooling`='gap' \(the preset's is 'token'\)"),
])
def test_a_preset_with_another_architecture_is_refused_naming_both(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vit_keras.create_model(**kwargs)


def test_train_takes_a_preset_as_weights_with_its_model_and_the_finetune_recipe():
    config = TrainConfig("fashion_mnist", weights=TINY)
    assert (config.model_name, config.recipe) == ("vit_ti16", "finetune")
    assert "recipe: finetune, because the weights are pretrained" in config.recipe_reason()
    with pytest.raises(ValueError, match=f"`model_name`='vit_b16' conflicts with preset '{TINY}'"):
        TrainConfig("fashion_mnist", weights=TINY, model_name="vit_b16")
    with pytest.raises(ValueError, match="`hidden_size`=96"):
        TrainConfig("fashion_mnist", weights=TINY, model_overrides=dict(hidden_size=96))


def test_cli_lists_presets_and_refuses_conflicts(capsys, tmp_path):
    assert cli.main(["presets", "--match", "tiny"]) == 0
    table = capsys.readouterr().out
    assert TINY in table and "| name " in table and "vit_base_patch16_224.orig_in21k " not in table
    assert cli.main(["presets", "vit_base_patch16_224_imagenet"]) == 0
    shown = capsys.readouterr().out
    assert "imagenet21k+imagenet2012/ViT-B_16-224.npz" in shown and "none recorded" in shown
    out = str(tmp_path / "run")
    assert cli.main(["train", "--out", out, "--weights", TINY, "--model", "vit_b16"]) == 2
    assert f"`model_name`='vit_b16' conflicts with preset '{TINY}'" in capsys.readouterr().err
    assert cli.main(["train", "--out", out, "--weights", "vit_tiny_patch16_224.augreg_in21k_ft"]) == 2
    error = capsys.readouterr().err
    assert "is no preset; the nearest presets: vit_tiny_patch16_224." in error and f"{TINY}," in error
    assert not os.path.exists(out)
