"""Bad input to `vit-keras export`: each gets a clear error and leaves no partial file behind."""

import os

import numpy as np
import pytest

import vit_keras
import keras

from disks import full_disk
from vit_keras.apps import cli
from vit_keras.convert import export as tflite_export
from vit_keras.convert import tflite

LABELS = [f"class_{i}" for i in range(10)]


@pytest.fixture(scope="module")
def vit_file(tmp_path_factory):
    keras.utils.set_random_seed(1)
    model = vit_keras.create_model("vit_ti16", image_size=28, patch_size=7, channels=1, hidden_size=16, num_heads=2,
                                   mlp_dim=32, num_layers=1, num_classes=10, include_preprocessing=True)
    folder = tmp_path_factory.mktemp("vit")
    model.save(folder / "model.keras")
    (folder / "labels.txt").write_text("\n".join(LABELS))
    return folder / "model.keras"


def images(n, size=28, channels=1):
    return np.random.default_rng(0).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


def test_not_a_vit(tmp_path):
    other = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    other.save(tmp_path / "cnn.keras")
    with pytest.raises(ValueError, match="not a vit_keras VisionTransformer"):
        tflite_export.export_tflite(tmp_path / "cnn.keras", tmp_path / "out.tflite", labels=LABELS)
    (tmp_path / "junk.keras").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a Keras model"):
        tflite_export.export_tflite(tmp_path / "junk.keras", tmp_path / "out.tflite", labels=LABELS)
    with pytest.raises(FileNotFoundError):
        tflite_export.export_tflite(tmp_path / "missing.keras", tmp_path / "out.tflite", labels=LABELS)
    assert not (tmp_path / "out.tflite").exists()


@pytest.mark.parametrize("calibration, message", [
    (None, "int8 needs `calibration`"),
    (images(20), r"`calibration` \(--calibration\) has 20 images; int8 needs at least 100"),
    (images(150, channels=4), "shape"),
    (images(150)[..., 0].reshape(150, -1), "shape"),
    (images(150) / 255.0, "0-255"),
    ("folder:/nonexistent/vit-data", r"`calibration` \(--calibration\) 'folder:/nonexistent/vit-data'.*nonexistent"),
    ("mnist_digits", r"`calibration` \(--calibration\) 'mnist_digits': Unknown dataset"),
])
def test_bad_calibration_keeps_the_old_file(vit_file, tmp_path, calibration, message):
    out = tmp_path / "model.tflite"
    out.write_bytes(b"previous export")
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        tflite_export.export_tflite(vit_file, out, quantize="int8", calibration=calibration)
    assert out.read_bytes() == b"previous export"
    assert os.listdir(tmp_path) == ["model.tflite"]


def test_calibration_is_fitted_to_the_model(vit_file):
    """Images of another size or mode calibrate as training sees them: resized, converted, still raw uint8."""
    model = tflite.load_vit(vit_file)
    fitted = tflite.calibration_images(images(150, size=40, channels=3), model)
    assert fitted.shape == (150, 28, 28, 1) and fitted.dtype == np.uint8 and fitted.max() > 128


def test_calibration_leaves_the_callers_array_alone_and_takes_whole_pixels(vit_file):
    model = tflite.load_vit(vit_file)
    pixels = np.full((120, 28, 28, 3), 100.4, np.float32)
    fitted = tflite.calibration_images(pixels, model)
    assert fitted.dtype == np.uint8 and int(fitted.max()) == 100
    rgb = np.full((120, 28, 28, 3), 100.0, np.float32)
    list(tflite.representative_dataset(rgb)())
    assert np.all(rgb == 100.0), "pinning the input range wrote into the caller's array"


def test_wrong_settings_fail_before_any_work(vit_file, tmp_path, capsys, monkeypatch):
    params = tflite.load_vit(vit_file).count_params()
    monkeypatch.setattr(tflite_export, "FLATBUFFER_LIMIT", 3 * params)  # as ViT-H/14 meets the 2 GiB in float32
    with pytest.raises(ValueError, match="over the 2 GiB a .tflite flatbuffer holds; use float16"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="float32")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="`calibration_size` must be at least 100"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="int8", calibration=images(500),
                                    calibration_size=50)
    with pytest.raises(TypeError, match="licence.*valid: name, description, version, license, author"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="float32", licence="MIT")
    assert cli.main(["export", str(vit_file), "--calibration", "folder:/nonexistent", "--calibration-size", "50",
                     "--out", str(tmp_path / "m.tflite")]) == 2
    assert "--calibration-size must be at least 100" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_unwritable_output(vit_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tflite_export.export_tflite(vit_file, tmp_path / "no" / "such" / "m.tflite")
    with pytest.raises(ValueError, match="is a directory"):
        tflite_export.export_tflite(vit_file, tmp_path)
    # /proc refuses new files even for root: the failure comes at the write, after conversion.
    with pytest.raises(OSError, match="could not write `out` '/proc/vit-keras-test.tflite'"):
        tflite_export.export_tflite(vit_file, "/proc/vit-keras-test.tflite")
    assert not os.path.exists("/proc/vit-keras-test.tflite")
    assert os.listdir(tmp_path) == []


def test_quantization_mode_rejected(vit_file, tmp_path, capsys):
    for mode in ("int4", "bfloat16"):
        with pytest.raises(ValueError, match="valid values are float32, float16, dynamic, int8"):
            tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize=mode)
    assert cli.main(["export", str(vit_file), "--quantize", "int4", "--out", str(tmp_path / "m.tflite")]) == 2
    assert "valid values are" in capsys.readouterr().err
    assert cli.main(["export", str(vit_file), "--out", str(tmp_path / "m.tflite")]) == 2  # int8, no calibration
    assert "needs --calibration" in capsys.readouterr().err
    assert cli.main(["verify", "m.tflite", "--against", str(vit_file), "--data", "fashion_mnist", "--runs", "0"]) == 2
    assert "--runs must be a positive integer" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_unknown_int8_ranges_fail_before_any_conversion(vit_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tflite, "convert_graph", None)  # any conversion would fail on this
    with pytest.raises(ValueError, match="`ranges`='percentile'.*valid values are mse, minmax"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="int8", calibration=images(150),
                                    ranges="percentile")
    assert cli.main(["export", str(vit_file), "--calibration", "fashion_mnist", "--ranges", "max",
                     "--out", str(tmp_path / "m.tflite")]) == 2
    assert "Unknown --ranges 'max'; valid values are mse, minmax" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_labels_must_match(vit_file, tmp_path):
    (tmp_path / "few.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="2 names but the model has 10 classes"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", labels=tmp_path / "few.txt")


def test_custom_ops_are_named():
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((4, 4), tf.float32)])
    def needs_flex(x):
        return tf.linalg.svd(x, compute_uv=False)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([needs_flex.get_concrete_function()])
    converter.allow_custom_ops = True  # what export never allows: a custom op in the flatbuffer
    assert tflite.unsupported_ops(converter.convert()) == ["Svd"]


def test_a_model_the_runtime_rejects_is_refused_before_writing():
    with pytest.raises(ValueError, match="LiteRT rejects the `quantize`='int8' model"):
        tflite.check_litert_runs(b"TFL3 but not a model at all", "int8")


def test_cli_export_and_verify(vit_file, tmp_path, capsys):
    out = tmp_path / "m.tflite"
    assert cli.main(["export", str(vit_file), "--quantize", "float16", "--out", str(out)]) == 0
    assert out.exists() and "wrote" in capsys.readouterr().out
    assert cli.main(["verify", str(out), "--against", str(vit_file), "--data", "fashion_mnist", "--limit", "50",
                     "--runs", "5", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "| m.tflite |" in table and "Interpreter 1T ms" in table and "CompiledModel 1T ms" in table


def test_verify_fits_the_data_to_the_model(tmp_path):
    """A 32x32 RGB model verified on 28x28 gray Fashion-MNIST: the images are resized and converted as in training."""
    from vit_keras.convert.verify import verify_files

    model = vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, hidden_size=16, num_heads=2, mlp_dim=32,
                                   num_layers=1, num_classes=10, include_preprocessing=True)
    model.save(tmp_path / "rgb.keras")
    (tmp_path / "labels.txt").write_text("\n".join(LABELS))
    tflite_export.export_tflite(tmp_path / "rgb.keras", tmp_path / "rgb.tflite", quantize="float32")
    table = verify_files([str(tmp_path / "rgb.tflite")], str(tmp_path / "rgb.keras"), "fashion_mnist", limit=20,
                         runs=2, threads=(1,))
    assert "| rgb.tflite |" in table and "100.00%" in table


def test_dynamic_batch(vit_file, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    out = tmp_path / "dyn.tflite"
    tflite_export.export_tflite(vit_file, out, quantize="float32", dynamic_batch=True)
    interpreter = Interpreter(model_path=str(out))
    detail = interpreter.get_input_details()[0]
    assert list(detail["shape_signature"]) == [-1, 28, 28, 3]
    interpreter.resize_tensor_input(detail["index"], [4, 28, 28, 3])
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], np.zeros((4, 28, 28, 3), np.float32))
    interpreter.invoke()
    scores = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert scores.shape == (4, 10) and np.allclose(scores.sum(-1), 1.0, atol=1e-5)
    from vit_keras.convert.runtime import delegation_report

    assert not delegation_report(out)["fallback"]  # the class token and readout take no batch-sized op


def test_calibration_size_is_honoured(vit_file, tmp_path, monkeypatch):
    """Every one of calibration_size images reaches the calibrator, beyond the default 300 too."""
    seen = []

    def counting(images):
        seen.append(len(images))
        return representative_dataset(images)

    representative_dataset = tflite.representative_dataset
    monkeypatch.setattr(tflite, "representative_dataset", counting)
    tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="int8", calibration=images(350),
                                calibration_size=320, int8_activations="static")
    assert seen == [320]


def test_unknown_keywords_name_the_nearest_valid_one(vit_file, tmp_path):
    """A misspelt parameter or metadata field reaches **metadata_fields: it is refused before any work, naming the
    keyword meant."""
    from vit_keras.convert.metadata import read_model_metadata

    for keywords, meant in [(dict(quantise="int8"), "quantize"), (dict(licence="MIT"), "license"),
                            (dict(calibration_sise=300), "calibration_size")]:
        with pytest.raises(TypeError, match=rf"export_tflite\(\) got unknown keyword argument .*did you mean '{meant}'"):
            tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="float32", **keywords)
    with pytest.raises(TypeError, match="'colour'.*valid keywords are .*quantize.*Metadata fields"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", colour="red")
    assert os.listdir(tmp_path) == []
    tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="float32", author="someone", version="2")
    written, _ = read_model_metadata(str(tmp_path / "m.tflite"))  # the metadata fields themselves pass, into the file
    assert written["author"] == "someone" and written["version"] == "2"


@pytest.mark.parametrize("settings, message", [
    (dict(min_agreement=1.5), r"`min_agreement` \(--min-agreement\) must be a top-1 agreement in \(0, 1\].*1.5"),
    (dict(min_agreement=0), r"in \(0, 1\].*got 0"),
    (dict(min_agreement=-0.2), r"in \(0, 1\]"),
    (dict(min_agreement="high"), r"in \(0, 1\].*'high'"),
    (dict(min_agreement=0.99, quantize="float16"), "int8 only"),
    (dict(min_agreement=0.995, calibration_size=250), r"`calibration_size` \(--calibration-size\) of at least 1100: "
                                                      "100 images to calibrate on and 1000 held out.*got 250"),
    (dict(min_agreement=0.995, calibration=images(260), calibration_size=2000),
     "at least 1100 calibration images.*has 260"),
    (dict(min_agreement=0.98, int8_activations="dynamic"), r"`min_agreement` \(--min-agreement\) applies to static int8"),
    (dict(ranges="mse", int8_activations="dynamic"), r"`ranges` \(--ranges\) applies to static int8: pass int8_activations='static'"),
    (dict(float_ops=(), int8_activations="dynamic"), r"`float_ops` applies to static int8"),
    (dict(int8_activations="weights"), "Unknown `int8_activations`='weights'.*valid values are auto, dynamic, static"),
])
def test_min_agreement_bad_inputs_fail_before_any_conversion(vit_file, tmp_path, monkeypatch, settings, message):
    def no_conversion(*args, **kwargs):
        raise AssertionError("converted despite bad input")

    monkeypatch.setattr(tflite, "convert_graph", no_conversion)
    settings = {"quantize": "int8", "calibration": images(500), "calibration_size": 500,
                "int8_activations": "static", **settings}
    with pytest.raises(ValueError, match=message):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", **settings)
    assert os.listdir(tmp_path) == []


def test_cli_min_agreement_out_of_range(vit_file, tmp_path, capsys):
    assert cli.main(["export", str(vit_file), "--calibration", "folder:/nonexistent", "--min-agreement", "2",
                     "--out", str(tmp_path / "m.tflite")]) == 2
    assert "--min-agreement) must be a top-1 agreement in (0, 1], such as 0.995; got 2.0" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_calibration_folder_too_small_names_the_option(vit_file, tmp_path):
    """A folder of 30 photos: its training part is too few to calibrate on, said before any conversion."""
    from PIL import Image

    for i, image in enumerate(images(30, size=20, channels=3)):
        os.makedirs(tmp_path / "photos" / f"c{i % 2}", exist_ok=True)
        Image.fromarray(image).save(tmp_path / "photos" / f"c{i % 2}" / f"{i}.png")
    with pytest.raises(ValueError, match=r"`calibration` \(--calibration\) has 27 images \(a folder calibrates on its "
                                         "training part, 90% of it\); int8 needs at least 100"):
        tflite_export.export_tflite(vit_file, tmp_path / "m.tflite", quantize="int8",
                                    calibration=f"folder:{tmp_path / 'photos'}")
    assert not (tmp_path / "m.tflite").exists()


def test_a_full_disk_names_the_file_and_keeps_the_old_one(vit_file, tmp_path, capsys):
    with full_disk(tmp_path / "disk") as fill:
        out = tmp_path / "disk" / "model.tflite"
        out.write_bytes(b"the earlier export")
        fill()
        with pytest.raises(OSError, match=f"the disk is full: writing {out} failed .* Free some space there"):
            tflite_export.export_tflite(vit_file, out, labels=LABELS)
        assert out.read_bytes() == b"the earlier export"
        assert not [name for name in os.listdir(out.parent) if name.startswith(".tmp-")]
        assert cli.main(["export", str(vit_file), "--out", str(out), "--quantize", "float32"]) == 2
        assert f"error: the disk is full: writing {out}" in capsys.readouterr().err
