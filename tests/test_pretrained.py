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


@pytest.mark.parametrize("case", ["hf_dinov2_registers", "timm_deit_distilled"])
def test_the_variants_export_with_the_folders_labels(case, tmp_path):
    """Registers, LayerScale and the [cls; mean] readout (DINOv2), the distillation token (DeiT): float32 equals
    Keras and int8 stays close, with the folder's class names in the file's metadata and no --labels."""
    import vit_keras
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.graph import keras_scores
    from vit_keras.convert.metadata import read_labels
    from vit_keras.convert.runtime import tflite_scores

    size = cases.CASES[case]["image_size"]
    model = vit_keras.from_pretrained(folder(case))
    test = cases.pixels(size, 1, count=8)
    reference = keras_scores(model, test)
    for mode, tolerance in (("float32", 1e-5), ("int8", 0.03)):
        out = tmp_path / f"{mode}.tflite"
        export_tflite(model, out, quantize=mode, calibration=cases.pixels(size, 0, count=100), calibration_size=100)
        np.testing.assert_allclose(tflite_scores(out, test), reference, atol=tolerance)
        assert read_labels(str(out)) == LABELS


def test_create_model_takes_what_the_folder_says_unless_told_otherwise():
    """The issue's case: a folder's classes, names, epsilon and normalization, without retyping them; another
    num_classes drops the head (said), and its names with it."""
    import vit_keras

    model = vit_keras.create_model(weights=folder("hf_vit"))
    assert model.vit_config["num_classes"] == 4 and model.class_names == LABELS
    assert model.vit_config["norm_epsilon"] == 1e-12 and model.vit_config["pixel_mean"] == pytest.approx(
        [0.485, 0.456, 0.406])
    with pytest.warns(UserWarning, match="it has 4 classes and the model 2"):
        other = vit_keras.from_pretrained(folder("hf_vit"), num_classes=2)
    assert other.class_names is None and not np.any(other.head.kernel.numpy())


def write_config(tmp_path, case, **changes):
    """A copy of a fixture folder with config.json edited."""
    import shutil

    copy = tmp_path / case
    shutil.copytree(folder(case), copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("case, changes, message", [
    ("hf_vit", dict(model_type="swin"), r"`model_type`='swin' is not a ViT we build"),
    ("hf_dinov2", dict(use_swiglu_ffn=True), r"`use_swiglu_ffn`=True"),
    ("hf_vit", dict(hidden_act="relu"), r"`hidden_act`='relu'"),
    ("timm_deit3", dict(global_pool="map"), r"`global_pool`='map'"),
    ("hf_vit", dict(hidden_size=64), r"shape mismatch: embedding/kernel: checkpoint \(8, 8, 3, 32\), model "
                                      r"\(8, 8, 3, 64\)"),
])
def test_a_folder_we_cant_build_is_named(tmp_path, case, changes, message):
    import vit_keras

    with pytest.raises(ValueError, match=message):
        vit_keras.from_pretrained(write_config(tmp_path, case, **changes))


def test_a_timm_part_we_lack_is_named_by_its_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    import vit_keras

    copy = write_config(tmp_path, "timm_vit_mean_pool")
    tensors = load_file(copy / "model.safetensors")
    tensors.update({"fc_norm.weight": np.ones(32, np.float32), "fc_norm.bias": np.zeros(32, np.float32)})
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(ValueError, match=r"fc_norm \(a LayerNorm after the pooling\) \(fc_norm.weight\)"):
        vit_keras.from_pretrained(copy)


HUB_SCRIPT = """
import sys, warnings
import vit_keras
model = vit_keras.from_pretrained(sys.argv[1])
print("classes", model.vit_config["num_classes"], ",".join(model.class_names))
"""


def test_a_hub_name_downloads_through_huggingface_hubs_cache_once(tmp_path):
    """hf://org/name and hf-hub:org/name, fetched from a real HTTP server on 127.0.0.1 (HF_ENDPOINT), then read
    from the cache offline (HF_HUB_OFFLINE=1)."""
    import shutil
    import subprocess
    import sys

    from weight_server import HubServer

    shutil.copytree(folder("timm_deit3"), tmp_path / "hub" / "timm" / "deit3_tiny_test")
    shutil.copytree(folder("hf_vit"), tmp_path / "hub" / "google" / "vit-tiny-test")
    server = HubServer(str(tmp_path / "hub"))
    env = dict(os.environ, HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="3")
    try:
        for name in ("hf-hub:timm/deit3_tiny_test", "hf://google/vit-tiny-test"):
            run = subprocess.run([sys.executable, "-c", HUB_SCRIPT, name], env=env, capture_output=True, text=True,
                                 timeout=300)
            assert run.returncode == 0, run.stderr[-3000:]
            assert "classes 4 cat,dog,fox,owl" in run.stdout
        fetched = [path for method, path in server.requests if method == "GET"]
        assert any(p.endswith("timm/deit3_tiny_test/resolve/main/model.safetensors") for p in fetched)
        assert any(p.endswith("vit-tiny-test/resolve/main/preprocessor_config.json") for p in fetched)
        server.requests.clear()
        offline = dict(env, HF_HUB_OFFLINE="1")
        run = subprocess.run([sys.executable, "-c", HUB_SCRIPT, "hf://google/vit-tiny-test"], env=offline,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "classes 4" in run.stdout, run.stderr[-3000:]
        assert server.requests == []
        missing = subprocess.run([sys.executable, "-c", HUB_SCRIPT, "hf://google/no-such-model"], env=env,
                                 capture_output=True, text=True, timeout=300)
        assert missing.returncode != 0 and "hf://google/no-such-model" in missing.stderr
    finally:
        server.close()


def test_train_fine_tunes_a_folder_keeping_its_variant_and_normalization(tmp_path):
    """`vit-keras train --weights FOLDER` with no other model flag: the folder's architecture (registers,
    LayerScale, the [cls; mean] readout), and its per-channel normalization folded exactly into a grey model."""
    from vit_keras.training import train

    with pytest.warns(UserWarning, match="summing the RGB patch-embedding kernel"):
        record = train.train("fashion_mnist", str(tmp_path), weights=folder("hf_dinov2_registers"), limit=128,
                             epochs=1, batch_size=64, image_size=32, jit_compile=False, verbose=0, tensorboard=False)
    vit = record["vit"]
    assert (vit["hidden_size"], vit["pooling"], vit["register_tokens"], vit["layer_scale"]) == (32, "token_gap", 4,
                                                                                                 0.5)
    assert vit["pixel_mean"] == pytest.approx([np.mean([0.485, 0.456, 0.406])]) and vit["channels"] == 1


def test_a_grey_model_from_an_rgb_folder_is_exact_on_grey_images():
    import vit_keras

    rgb = vit_keras.from_pretrained(folder("timm_deit3"))
    grey = vit_keras.from_pretrained(folder("timm_deit3"), channels=1)
    images = cases.pixels(32, 0)[..., :1]
    np.testing.assert_allclose(grey.predict(images, verbose=0), rgb.predict(np.repeat(images, 3, -1), verbose=0),
                               atol=1e-5)


@pytest.mark.parametrize("case", ["hf_dinov2_registers", "timm_deit_distilled"])
def test_the_attention_output_of_a_variant_equals_the_keras_rollout(case, tmp_path):
    """Registers and a distillation token are skipped as the class token is; token_gap reads the class row and
    the patch rows' mean at half each, as visualize.attention_heatmap does."""
    import vit_keras
    from tflite_outputs import device_attention
    from vit_keras import visualize
    from vit_keras.convert.export import export_tflite

    model = vit_keras.from_pretrained(folder(case))
    images = cases.pixels(cases.CASES[case]["image_size"], 2)
    export_tflite(model, tmp_path / "a.tflite", quantize="float32", attention_output=True)
    np.testing.assert_allclose(device_attention(tmp_path / "a.tflite", images, classes=4),
                               visualize.attention_heatmap(model, images), atol=1e-5)
