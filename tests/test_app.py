"""The classifier runtime and `vit-keras classify`, on tiny trained ViTs exported by convert/."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app_models import bad_inputs, mode_variants
from vit_keras.apps.cli import COMMANDS, main
from vit_keras.apps.examples import bundled_examples, foolbox_data_dir
from vit_keras.constants import QUANTIZATIONS

REPO = Path(__file__).resolve().parents[1]
FOOLBOX = foolbox_data_dir()


@pytest.fixture(scope="session")
def test_images(tmp_path_factory, fashion_test):
    """The first 20 Fashion-MNIST test images as PNG files, with their labels."""
    images, labels = fashion_test
    folder = tmp_path_factory.mktemp("fashion")
    for i in range(20):
        Image.fromarray(images[i, :, :, 0], "L").save(folder / f"{i:02d}.png")
    return folder, images[:20], labels[:20]


def classify_json(capsys, *args):
    code = main(["classify", *map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="session")
def keras_top1(models, test_images):
    import keras

    import vit_keras  # noqa: F401

    model = keras.models.load_model(models["keras"])
    return model.predict(test_images[1].astype("float32"), verbose=0).argmax(-1)


@pytest.mark.parametrize("mode", QUANTIZATIONS + ("attention",))
def test_every_export_classifies_like_keras(models, test_images, keras_top1, capsys, mode):
    """No flags: float inputs get the metadata's normalization, uint8 inputs raw pixels; 1- and 3-channel."""
    code, out = classify_json(capsys, models[mode], test_images[0], "--top-k", "3")
    assert code == 0
    results = out["results"]
    assert [Path(r["path"]).name for r in results] == [f"{i:02d}.png" for i in range(20)]  # a folder, sorted
    labels = models["labels"].read_text().split("\n")
    top1 = [labels.index(r["top"][0]["label"]) for r in results]
    agreement = np.mean(np.array(top1) == keras_top1)
    assert agreement >= (0.9 if mode == "int8" else 1.0), (mode, top1, keras_top1)
    for r in results:
        scores = [t["score"] for t in r["top"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
        assert r["inference_ms"] > 0 and r["total_ms"] >= r["inference_ms"]
    channels = 1 if mode == "attention" else 3
    assert out["input"] == {"height": 28, "width": 28, "channels": channels,
                            "dtype": "uint8" if mode == "int8" else "float32"}


def test_text_output_names_labels_and_latency(models, test_images, capsys):
    assert main(["classify", str(models["int8"]), str(test_images[0] / "00.png"), "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(str(test_images[0] / "00.png")) and " ms model" in lines[0]
    assert len(lines[1].strip().split("  ")) == 2


def test_image_modes_and_animation_give_the_same_answer(models, test_images, tmp_path, capsys):
    gray = test_images[1][3, :, :, 0]
    variants = mode_variants(tmp_path, gray)
    code, out = classify_json(capsys, models["float32"], *variants.values())
    assert code == 0
    scores = [r["top"] for r in out["results"]]
    for name, top in zip(variants, scores):
        assert top == scores[0], name  # exact: every conversion restores the same pixels


def test_exif_rotation_is_applied(models, tmp_path, capsys):
    with Image.open(FOOLBOX / "imagenet_03_990.jpg") as photo:
        upright = photo.convert("RGB").crop((0, 0, 224, 150))
    upright.save(tmp_path / "upright.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": store the pixels turned the other way
    upright.transpose(Image.ROTATE_90).save(tmp_path / "rotated.png", exif=exif)
    from vit_keras.apps.images import load_image

    decoded, _ = load_image(tmp_path / "rotated.png")
    assert decoded.size == (224, 150) and np.array_equal(np.asarray(decoded), np.asarray(upright))
    code, out = classify_json(capsys, models["int8"], tmp_path / "upright.png", tmp_path / "rotated.png")
    assert code == 0 and out["results"][0]["top"] == out["results"][1]["top"]


def test_huge_image_is_classified_quickly(models, tmp_path, capsys):
    from vit_keras.apps.images import load_image

    with Image.open(FOOLBOX / "imagenet_00_243.jpg") as photo:
        photo.convert("RGB").resize((7000, 5000)).save(tmp_path / "huge.jpg", quality=80)  # 35 MP
    code, out = classify_json(capsys, models["float16"], tmp_path / "huge.jpg")
    assert code == 0 and out["results"][0]["total_ms"] < 15000  # loose: two test workers share two cores
    decoded, original = load_image(tmp_path / "huge.jpg", target_size=(28, 28))
    assert original == (7000, 5000) and decoded.size == (875, 625)  # JPEG draft: decoded at 1/8 scale


def test_bad_inputs_get_clear_messages_and_the_rest_still_run(models, tmp_path, capsys):
    cases = bad_inputs(tmp_path, FOOLBOX / "imagenet_00_243.jpg")
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "deleted.jpg")  # a broken symlink, as left by a moved photo
    cases["broken_symlink"] = (tmp_path / "gone.jpg", "cannot be read")
    (tmp_path / "._ok.jpg").write_bytes(b"\0\x05\x16\x07")  # macOS resource fork: not an image, not listed
    paths = [p for p, _ in cases.values()] + [tmp_path / "ok.jpg"]
    code, out = classify_json(capsys, models["int8"], *paths)
    assert code == 1  # some images failed
    by_name = {Path(r["path"]).name: r for r in out["results"]}
    for name, (path, words) in cases.items():
        assert words in by_name[path.name]["error"], (name, by_name[path.name])
    assert by_name["ok.jpg"]["top"]
    code, out = classify_json(capsys, models["int8"], tmp_path)  # the folder: every case but the hidden file
    assert sorted(Path(r["path"]).name for r in out["results"]) == sorted(["ok.jpg", *(p.name for p, _ in
                                                                                  cases.values())])


@pytest.mark.parametrize("content", [b"not a model at all", "truncated", "keras"])
def test_wrong_model_file_is_refused_clearly(models, test_images, tmp_path, capsys, content):
    path = tmp_path / "model.tflite"
    if content == "truncated":
        path.write_bytes(models["int8"].read_bytes()[:3000])
    elif content == "keras":
        path.write_bytes(models["keras"].read_bytes())
    else:
        path.write_bytes(content)
    assert main(["classify", str(path), str(test_images[0] / "00.png")]) == 2
    err = capsys.readouterr().err
    assert "model.tflite" in err and ("not a TFLite model" in err or "not a usable" in err
                                      or "could not be loaded" in err), err


def test_missing_image_and_empty_folder(models, tmp_path, capsys):
    assert main(["classify", str(models["int8"]), str(tmp_path / "nope.png")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["classify", str(models["int8"]), str(tmp_path)]) == 2
    assert "no images found" in capsys.readouterr().err


def test_runtimes_agree(models, test_images):
    """The classic Interpreter and the CompiledModel API give the same scores."""
    from vit_keras.apps.classifier import Classifier

    path = test_images[0] / "05.png"
    a = Classifier(models["attention"], runtime="interpreter").classify(path)
    b = Classifier(models["attention"], runtime="compiled").classify(path)
    assert [label for label, _ in a.top] == [label for label, _ in b.top]
    np.testing.assert_allclose([s for _, s in a.top], [s for _, s in b.top], atol=1e-5)
    np.testing.assert_allclose(a.attention, b.attention, atol=1e-5)


def test_attention_output_matches_keras_rollout(models, test_images):
    """The overlay from the .tflite's attention output equals the rollout of the .keras model's maps."""
    from vit_keras.apps.classifier import Classifier
    from vit_keras.apps.web import KerasAttention

    image = Image.open(test_images[0] / "07.png")
    from_tflite = Classifier(models["attention"]).classify_image(image).attention
    from_keras = KerasAttention(models["keras"])(image)
    assert from_tflite.shape == (4, 4)
    np.testing.assert_allclose(from_tflite, from_keras, atol=1e-3)


def test_examples_are_real_images():
    examples = bundled_examples()
    captions = [c for _, c in examples]
    assert sum(c.startswith("Fashion-MNIST") for c in captions) == 10
    assert sum(c.startswith("CIFAR-10") for c in captions) == 20
    assert sum(c.startswith("ImageNet") for c in captions) == 20
    for path, _ in examples[:10]:
        assert Image.open(path).size == (28, 28)


def test_runtime_never_imports_tensorflow():
    """The device runtime loads LiteRT, NumPy and Pillow only: no TensorFlow or Keras, and of vit_keras only the
    light package, its constants and the TF-free metadata reader."""
    code = ("import sys; import vit_keras.apps.classifier, vit_keras.apps.web, vit_keras.apps.examples, "
            "vit_keras.apps.commands.classify, vit_keras.apps.commands.serve\n"
            "allowed = ('vit_keras', 'vit_keras.constants', 'vit_keras.convert', 'vit_keras.convert.metadata')\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'mediapipe', 'jax', 'torch') "
            "or (m.startswith('vit_keras') and m not in allowed and not m.startswith('vit_keras.apps'))]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_serve_refuses_a_wrong_model_before_starting(tmp_path, capsys):
    path = tmp_path / "labels.tflite"
    path.write_text("T-shirt/top\nTrouser\n")
    assert main(["serve", str(path), "--port", "1"]) == 2
    assert "not a TFLite model" in capsys.readouterr().err


@pytest.mark.parametrize("runtime", ["interpreter", "compiled"])
def test_thread_count_probe(models, test_images, runtime):
    """By default the app times its thread pool against one thread and keeps the faster; --threads is obeyed."""
    from vit_keras.apps.classifier import Classifier

    path = test_images[0] / "05.png"
    pool = min(4, os.cpu_count() or 1)
    chosen = Classifier(models["int8"], runtime=runtime, workers=2)
    assert chosen.threads in {1, pool}
    assert chosen._pool.qsize() == 2  # the workers' runners are made with the chosen count
    fixed = Classifier(models["int8"], threads=pool, runtime=runtime)
    assert fixed.threads == pool
    a, b = chosen.classify(path), fixed.classify(path)
    assert [label for label, _ in a.top] == [label for label, _ in b.top]
    np.testing.assert_allclose([s for _, s in a.top], [s for _, s in b.top], atol=1e-6)


def test_every_help_page_renders(capsys):
    # argparse formats help text with %, so a stray "%" in one command's help broke `vit-keras --help`.
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
    for command in ["", *COMMANDS]:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"] if command else ["--help"])
        assert exit_info.value.code == 0
        assert "usage: vit-keras" in capsys.readouterr().out


def test_attention_heat_map_on_a_rectangular_grid_and_repeated_labels():
    from vit_keras.apps.attention import attention_heatmap
    from vit_keras.apps.web import top_scores

    rng = np.random.default_rng(0)
    for tokens, grid in ((49, (8, 6)), (48, (8, 6))):  # with and without a class token; 49 is also 7x7
        maps = rng.random((1, 2, 3, tokens, tokens))
        assert attention_heatmap([maps], grid).shape == grid
    with pytest.raises(ValueError, match="8x6 grid"):
        attention_heatmap([rng.random((1, 2, 3, 50, 50))], (8, 6))
    assert top_scores([("crane", 0.5), ("crane", 0.3), ("crane", 0.1)]) == {"crane": 0.5, "crane (2)": 0.3,
                                                                             "crane (3)": 0.1}


# ---- a model normalized per channel ----------------------------------------------------------------------

PER_CHANNEL = dict(pixel_mean=(0.4914, 0.4822, 0.4465), pixel_std=(0.247, 0.2435, 0.2616))


def per_channel_model(include_preprocessing=True):
    """A tiny RGB ViT with CIFAR-10's per-channel normalization; its head scaled up so images get distinct top-1s."""
    import keras

    import vit_keras

    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", image_size=28, patch_size=7, hidden_size=32, num_heads=2, mlp_dim=32,
                                   num_layers=1, num_classes=5, include_preprocessing=include_preprocessing,
                                   **PER_CHANNEL)
    model.head.kernel.assign(np.random.default_rng(0).normal(0, 2.0, model.head.kernel.shape))
    return model


def colour_images(folder, fashion_test, count=30):
    """Fashion-MNIST test images tinted with random RGB colours, saved as PNG: (folder, uint8 (N, 28, 28, 3))."""
    images = fashion_test[0][:count].astype("float32")
    tint = np.random.default_rng(3).uniform(0.3, 1.0, (count, 1, 1, 3))
    rgb = np.round(images * tint).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(rgb):
        Image.fromarray(image, "RGB").save(folder / f"{i:02d}.png")
    return folder, rgb


def test_classifier_reads_a_per_channel_model(tmp_path, fashion_test):
    """The exported file takes raw pixels (mean 0, std 1) and normalizes per channel itself: the app gives the
    Keras model's scores in float32, and in int8 the scores LiteRT gives the same raw pixels."""
    from vit_keras.apps.classifier import Classifier
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.runtime import tflite_scores

    model = per_channel_model()
    folder, rgb = colour_images(tmp_path / "images", fashion_test)
    logits = model.predict(rgb.astype("float32"), verbose=0)
    assert len(set(logits.argmax(-1))) >= 3  # the images get different answers
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    for mode in ("float32", "int8"):
        path = tmp_path / f"{mode}.tflite"
        export_tflite(model, path, quantize=mode, labels=list("abcde"), calibration=np.tile(rgb, (4, 1, 1, 1)),
                      calibration_size=120)
        classifier = Classifier(path)
        assert classifier.mean.tolist() == [0.0] and classifier.std.tolist() == [1.0]
        tops = [dict(classifier.classify(folder / f"{i:02d}.png", top_k=5).top) for i in range(len(rgb))]
        scores = np.array([[top[label] for label in "abcde"] for top in tops])
        if mode == "float32":
            np.testing.assert_allclose(scores, expected, atol=1e-4)
        else:  # an untrained model's int8 is coarse; what matters here is that the app feeds it the right input
            np.testing.assert_allclose(scores, tflite_scores(path, rgb), atol=1e-5)
            assert np.mean(scores.argmax(-1) == logits.argmax(-1)) >= 0.75


def test_classifier_applies_per_channel_metadata(tmp_path, fashion_test):
    """A file from another tool may carry per-channel NormalizationOptions (MediaPipe refuses them; the app
    takes them): the app normalizes each channel by its own mean and std. A wrong length is refused."""
    import tensorflow as tf

    from vit_keras.apps.classifier import Classifier
    from vit_keras.convert.export import classifier_metadata
    from vit_keras.convert.graph import concrete_function
    from vit_keras.convert.metadata import populate
    from vit_keras.models.normalization import pixel_normalization

    model = per_channel_model()
    folder, rgb = colour_images(tmp_path / "images", fashion_test, count=10)
    function = concrete_function(model, raw_pixels=False)  # its input: normalized per channel, by the runtime
    flatbuffer = tf.lite.TFLiteConverter.from_concrete_functions([function]).convert()
    mean, std = pixel_normalization(model.vit_config)
    for values, error in (((mean, std), None), ((mean[:2], std[:2]), "normalization mean has 2 values")):
        meta = classifier_metadata(model, list("abcde"), "float32", np.float32)
        meta["subgraph_metadata"][0]["input_tensor_metadata"][0]["process_units"][0]["options"] = {
            "mean": [float(v) for v in values[0]], "std": [float(v) for v in values[1]]}
        path = tmp_path / f"{len(values[0])}.tflite"
        path.write_bytes(populate(flatbuffer, meta, {"labels.txt": b"a\nb\nc\nd\ne\n"}))
        if error:
            with pytest.raises(ValueError, match=error):
                Classifier(path)
            continue
        classifier = Classifier(path)
        scores = [dict(classifier.classify(folder / f"{i:02d}.png", top_k=5).top) for i in range(len(rgb))]
        logits = model.predict(rgb.astype("float32"), verbose=0)
        expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        np.testing.assert_allclose([[s[label] for label in "abcde"] for s in scores], expected, atol=1e-4)


def test_web_overlay_normalizes_as_the_model_says(tmp_path, fashion_test):
    """The web app's attention overlay from a .keras model without a preprocessing layer feeds it per-channel
    normalized pixels, as explain and inspect do (visualize.model_inputs)."""
    from vit_keras.apps.attention import attention_heatmap
    from vit_keras.apps.web import KerasAttention

    model = per_channel_model(include_preprocessing=False)
    model.save(tmp_path / "model.keras")
    _, rgb = colour_images(tmp_path / "images", fashion_test, count=1)
    heat = KerasAttention(tmp_path / "model.keras")(Image.fromarray(rgb[0], "RGB"))

    def overlay_for(inputs):
        return attention_heatmap([np.stack(model.attention_maps(inputs.astype("float32")), axis=1)], (4, 4))

    by_hand = (rgb / 255.0 - np.array(PER_CHANNEL["pixel_mean"])) / np.array(PER_CHANNEL["pixel_std"])
    np.testing.assert_allclose(heat, overlay_for(by_hand), atol=1e-4)
    assert np.abs(heat - overlay_for(rgb / 127.5 - 1.0)).max() > 1e-3  # the normalization is what it depends on


@pytest.fixture(scope="module")
def attention_file(models, tmp_path_factory):
    """The app's tiny ViT exported with --attention-output, alone in its folder (no .keras beside it)."""
    folder = tmp_path_factory.mktemp("attention_export")
    out = folder / "model_attention.tflite"
    assert main(["export", str(models["keras"]), "--quantize", "float32", "--attention-output", "--out", str(out)]) == 0
    return out


def keras_heatmaps(models, images):
    """vit_keras.visualize.attention_heatmap of the .keras model, each map scaled to [0, 1] as the app draws it."""
    import keras

    from vit_keras import visualize

    heat = visualize.attention_heatmap(keras.models.load_model(models["keras"]), images)
    low = heat.min(axis=(1, 2), keepdims=True)
    return (heat - low) / (heat.max(axis=(1, 2), keepdims=True) - low)


def test_classify_json_gives_the_device_attention_map(attention_file, models, test_images, capsys):
    """classify --json on an --attention-output file: each result's "attention" is the file's own output, equal to
    visualize.attention_heatmap of the .keras model (both scaled to [0, 1]) within 1e-4."""
    folder, images, _ = test_images
    paths = [folder / f"{i:02d}.png" for i in range(6)]
    code, document = classify_json(capsys, attention_file, *paths)
    assert code == 0
    maps = np.array([result["attention"] for result in document["results"]])
    assert maps.shape == (6, 4, 4)
    np.testing.assert_allclose(maps, keras_heatmaps(models, images[:6]), atol=1e-4)
    code, plain = classify_json(capsys, models["float32"], paths[0])
    assert "attention" not in plain["results"][0]


def test_gradio_page_draws_the_device_attention(attention_file, test_images):
    """The Gradio page over an --attention-output file draws the overlay from the file's output, no .keras given."""
    from vit_keras.apps.attention import overlay
    from vit_keras.apps.classifier import Classifier
    from vit_keras.apps.web import build_demo

    classifier = Classifier(attention_file)
    demo = build_demo(classifier, examples=[])
    upload = next(f.fn for f in demo.fns.values() if f.api_name == "classify_upload")
    path = str(test_images[0] / "03.png")
    shown, scores, status, _ = upload(path)
    prediction = classifier.classify(path)
    assert "**" + prediction.top[0][0] + "**" in status and set(scores) >= {prediction.top[0][0]}
    assert np.abs(np.asarray(shown, np.float32) - np.asarray(overlay(prediction.image, None), np.float32)).max() > 20
    assert np.array_equal(np.asarray(shown), np.asarray(overlay(prediction.image, prediction.attention)))
    info = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "model-info")
    assert "attention overlay from the model's attention output" in info.value


def test_browser_site_draws_the_device_attention(attention_file, models, test_images, tmp_path, capsys):
    """export-web's page on an --attention-output file: MediaPipe returns the map as a second head, the page draws
    it over the image, and window.lastResult.attention equals classify --json's within 0.02 (both [0, 1])."""
    test_web_export = pytest.importorskip("test_web_export")
    if test_web_export.RUNTIME_MISSING or not os.path.exists(test_web_export.CHROMIUM):
        pytest.skip("the npm runtime (scripts/setup.sh) or Debian's chromium is missing")
    folder = test_images[0]
    paths = [folder / f"{i:02d}.png" for i in range(3)]
    _, document = classify_json(capsys, attention_file, *paths)
    site = tmp_path / "site"
    assert main(["export-web", str(attention_file), "--out", str(site)]) == 0
    with test_web_export.playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=test_web_export.CHROMIUM,
                                             args=test_web_export.CHROMIUM_ARGS)
        with test_web_export.static_server(site) as url:
            page = test_web_export.SitePage(browser, url)
            results = [page.upload(path)[0] for path in paths]
            page.page.screenshot(path=str(tmp_path / "attention_page.png"), full_page=True)
            page.close()
        browser.close()
    for result, cli in zip(results, document["results"]):
        assert result["labels"][0] == cli["top"][0]["label"] and len(result["labels"]) == 5
        np.testing.assert_allclose(result["attention"], cli["attention"], atol=0.02)


# ---- classify a .keras model; --output ----------------------------------------------------------------------

TINY_KERAS = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, num_classes=3)
TINY_CLASSES = ["cat", "dog", "fox"]


def tiny_keras_model(path, **options):
    """A tiny untrained RGB ViT, its head scaled so the images get distinct scores, saved at ``path``."""
    import keras

    import vit_keras

    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", **{**TINY_KERAS, **options})
    model.head.kernel.assign(np.random.default_rng(1).normal(0, 2.0, model.head.kernel.shape))
    model.save(path)
    return model


@pytest.fixture(scope="module")
def tiny_photos(tmp_path_factory):
    """A folder of three 32x32 RGB PNGs and one broken file: (folder, the PNGs' paths, their uint8 pixels)."""
    folder = tmp_path_factory.mktemp("photos")
    pixels = np.random.default_rng(2).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    paths = [folder / f"{i}.png" for i in range(3)]
    for path, image in zip(paths, pixels):
        Image.fromarray(image, "RGB").save(path)
    (folder / "3_broken.png").write_bytes(b"not a png")
    return folder, paths, pixels


def read_csv(path):
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_classify_a_keras_model_to_csv_and_json(tmp_path, tiny_photos, capsys):
    """A .keras model classifies a folder as vit_keras.predict does on the same pixels; --output writes the rows
    as CSV (best first, an error column for the broken file) and the --json document as JSON."""
    import vit_keras

    folder, paths, pixels = tiny_photos
    model = tiny_keras_model(tmp_path / "model.keras", class_names=TINY_CLASSES)
    expected = vit_keras.predict(model, pixels.astype("float32"), top_k=3)
    code = main(["classify", str(tmp_path / "model.keras"), str(folder), "--top-k", "3",
                 "--output", str(tmp_path / "x.csv")])
    captured = capsys.readouterr()
    assert code == 1  # the broken file; the others still classified
    assert "3_broken.png: error:" in captured.err and f"results: {tmp_path / 'x.csv'}" in captured.out
    header, *rows = read_csv(tmp_path / "x.csv")
    assert header == ["path", "label_1", "score_1", "label_2", "score_2", "label_3", "score_3", "error"]
    assert [row[0] for row in rows] == [*map(str, paths), str(folder / "3_broken.png")]
    for row, labels, scores in zip(rows, expected.labels, expected.scores):
        assert row[1:6:2] == list(labels) and sorted(row[1:6:2]) == TINY_CLASSES and row[-1] == ""
        shown = np.array(row[2:7:2], float)
        assert np.all(np.diff(shown) <= 0) and shown.sum() <= 1 + 1e-5
        np.testing.assert_allclose(shown, scores, atol=2e-6)
    assert rows[-1][1:7] == [""] * 6 and "not an image file" in rows[-1][-1]

    code = main(["classify", str(tmp_path / "model.keras"), *map(str, paths), "--top-k", "2", "--json",
                 "--output", str(tmp_path / "x.json")])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and json.loads((tmp_path / "x.json").read_text()) == printed
    assert printed["input"] == {"height": 32, "width": 32, "channels": 3, "dtype": "float32"}
    assert "its batch's time divided by the batch's images" in printed["timing"]
    for result, labels, scores in zip(printed["results"], expected.labels, expected.scores):
        assert [entry["label"] for entry in result["top"]] == list(labels[:2])
        np.testing.assert_allclose([entry["score"] for entry in result["top"]], scores[:2], atol=1e-6)
        assert result["inference_ms"] > 0 and result["total_ms"] >= result["inference_ms"]


def test_classify_a_keras_model_that_takes_normalized_pixels(tmp_path, tiny_photos, capsys):
    """include_preprocessing=False: classify normalizes the pixels as the model was built to take them; a model
    without class names gets labels.txt beside it."""
    import vit_keras
    from vit_keras.models.normalization import normalize

    _, paths, pixels = tiny_photos
    model = tiny_keras_model(tmp_path / "model.keras", include_preprocessing=False, pixel_mean="imagenet")
    (tmp_path / "labels.txt").write_text("\n".join(TINY_CLASSES) + "\n")
    expected = vit_keras.predict(model, normalize(pixels, model.vit_config), top_k=3)
    code = main(["classify", str(tmp_path / "model.keras"), *map(str, paths), "--top-k", "5", "--output",
                 str(tmp_path / "x.csv")])
    assert code == 0
    header, *rows = read_csv(tmp_path / "x.csv")
    assert len(header) == 1 + 2 * 3 + 1  # --top-k 5 of 3 classes: 3
    for row, indices, scores in zip(rows, expected.indices, expected.scores):
        assert row[1:6:2] == [TINY_CLASSES[i] for i in indices]
        np.testing.assert_allclose(np.array(row[2:7:2], float), scores, atol=2e-6)
    out = capsys.readouterr().out
    assert all(f"{path}  [" in out and " ms model, " in out for path in paths)


def test_classify_tflite_to_csv_agrees_with_keras(tmp_path, tiny_photos, capsys):
    from vit_keras.convert.export import export_tflite

    _, paths, _ = tiny_photos
    model = tiny_keras_model(tmp_path / "model.keras", class_names=TINY_CLASSES)
    export_tflite(model, tmp_path / "model.tflite", quantize="float32", labels=TINY_CLASSES)
    for name in ("model.keras", "model.tflite"):
        assert main(["classify", str(tmp_path / name), *map(str, paths), "--top-k", "3", "--output",
                     str(tmp_path / f"{name}.csv")]) == 0
    keras_rows, tflite_rows = (read_csv(tmp_path / f"{name}.csv") for name in ("model.keras", "model.tflite"))
    assert keras_rows[0] == tflite_rows[0]
    for keras_row, tflite_row in zip(keras_rows[1:], tflite_rows[1:]):
        assert keras_row[:2] == tflite_row[:2]  # path, top-1 label
        np.testing.assert_allclose(np.array(keras_row[2:7:2], float), np.array(tflite_row[2:7:2], float), atol=1e-4)


@pytest.mark.parametrize("args, message", [
    (["--output", "results.txt"], "--output must name a .csv or a .json file; got 'results.txt'"),
    (["--output", "results"], "--output must name a .csv or a .json file"),
    (["--threads", "2"], "--threads and --runtime set LiteRT's options: a .keras model takes neither"),
])
def test_classify_refuses_bad_options_before_loading_the_model(tmp_path, tiny_photos, capsys, args, message):
    (tmp_path / "model.keras").write_bytes(b"never loaded")
    model = tmp_path / ("model.keras" if "--threads" in args else "model.tflite")
    assert main(["classify", str(model), str(tiny_photos[0]), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.txt").exists()
