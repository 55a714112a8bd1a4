"""A checkpoint folder builds the whole model: tiny folders of each ViT variant, saved by transformers and timm
(scripts/make_pretrained_fixtures.py), loaded with ``from_pretrained(folder)`` alone, against the owners' logits."""

import json
import os

import numpy as np
import pytest

import pretrained_cases as cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = ["cat", "dog", "fox", "owl"]


def folder(case):
    return os.path.join(ROOT, cases.FIXTURES, case)


@pytest.mark.parametrize("case", list(cases.CASES))
def test_a_folder_alone_builds_the_model_its_library_runs(case):
    import vit_keras

    spec = cases.CASES[case]
    model = vit_keras.from_pretrained(folder(case))
    images = cases.pixels(spec["image_size"], spec["seed"])
    expected = np.load(os.path.join(folder(case), "expected.npz"))["logits"]
    got = model.predict(images, verbose=0)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert model.class_names == LABELS
    assert model.takes_raw_pixels
    assert model.vit_config["pixel_mean"] == pytest.approx(declared(case, "image_mean", "mean"))
    assert model.vit_config["pixel_std"] == pytest.approx(declared(case, "image_std", "std"))


def declared(case, hf_key, timm_key):
    """What the folder's own JSON declares: a Hugging Face processor's ``hf_key``, or timm's pretrained_cfg."""
    if cases.CASES[case]["library"] == "transformers":
        with open(os.path.join(folder(case), "preprocessor_config.json")) as f:
            return json.load(f)[hf_key]
    with open(os.path.join(folder(case), "config.json")) as f:
        return json.load(f)["pretrained_cfg"][timm_key]
