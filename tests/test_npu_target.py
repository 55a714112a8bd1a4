"""The full-integer "npu" export target: the int16 graph (convert/integer_graph.py) exact in float, the
traced graph with it equal to Keras, the file it writes (uint8 in, int16 scores out, no float op, both NPU plugins
take it whole), verify's NPU column, and the options it refuses (library and CLI)."""

import types

import numpy as np
import pytest

import vit_keras
import keras

from vit_keras.apps import cli
from vit_keras.constants import EXPORT_TARGETS, MIN_CALIBRATION_IMAGES
from vit_keras.convert import export as tflite_export
from vit_keras.convert import flatbuffer, npu, tflite
from vit_keras.convert import metadata as tflite_metadata
from vit_keras.convert.graph import concrete_function, forward, keras_scores
from vit_keras.convert.integer_graph import IntegerRanges, piecewise_rsqrt, sum_of_squares
from vit_keras.convert.runtime import tflite_scores

LABELS = [f"class_{i}" for i in range(10)]
TINY = dict(image_size=28, patch_size=7, channels=1, hidden_size=32, num_heads=2, mlp_dim=32, num_layers=1,
            num_classes=10, include_preprocessing=True)
# Named variants the float parity tests of test_convert.py export: plain (class token), GAP, sequence pooling, LSA,
# the conv stem and the r8 hybrid.
VARIANTS = {"plain": {}, "gap": dict(pooling="gap", class_token=False), "sequence": dict(pooling="sequence"),
            "lsa": dict(locality_attention=True, num_layers=2), "conv_stem": dict(stem="conv", patch_size=4),
            "resnet_r8": dict(stem="r8", patch_size=4)}


def tiny_model(seed=0, **changes):
    """A tiny untrained ViT with a head scaled up so that its top-1 is a real decision (not a near-tie of ~0.1s)."""
    keras.utils.set_random_seed(seed)
    model = vit_keras.create_model("vit_ti16", **{**TINY, **changes})
    rng = np.random.default_rng(seed)
    head = model.head
    head.set_weights([rng.normal(0, 0.5, head.kernel.shape).astype("float32"), np.zeros(head.bias.shape, "float32")])
    for layer in model._flatten_layers():  # trained-like scales: GroupNorm gn3 starts at gamma = 0 (BiT)
        if isinstance(layer, keras.layers.GroupNormalization):
            layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape))
    return model


def images(n, seed=0, size=28, channels=1):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


def rgb(batch):
    import tensorflow as tf

    return tf.constant(np.repeat(batch, 3, axis=-1) if batch.shape[-1] == 1 else batch, tf.float32)


# ---- integer_graph: exact in float - ------------------------------------------------------------------------------

def test_sum_of_squares_is_the_plain_sum_of_squares():
    x = np.random.default_rng(0).normal(0, 3, (2, 5, 48)).astype("float32")
    x[0, 1, 7] = 590.0  # a "massive activation" as the real ViT-Ti has
    got = np.asarray(sum_of_squares(x))
    assert got.shape == (2, 5, 1)
    np.testing.assert_allclose(got, np.sum(x.astype("float64") ** 2, axis=-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_piecewise_rsqrt_is_the_plain_rsqrt_over_seven_decades(pieces):
    variance = (10.0 ** np.random.default_rng(1).uniform(-3, 4, (4, 257, 1))).astype("float32")
    variance[0, 0, 0], variance[0, 1, 0] = 1e-3, 1e4  # both ends of the range
    got = np.asarray(piecewise_rsqrt(variance, float(variance.max()), pieces=pieces)).astype("float64")
    expected = 1.0 / np.sqrt(variance.astype("float64"))
    assert np.abs(got / expected - 1.0).max() < 1e-5


def test_variance_ranges_record_then_apply_and_name_a_layer_never_recorded():
    first, second = types.SimpleNamespace(path="block_0/norm1"), types.SimpleNamespace(path="block_0/norm2")
    ranges = IntegerRanges()
    low = np.array([[[0.5], [2.0]]], "float32")
    high = np.array([[[30.0], [4000.0]]], "float32")
    for variance in (low, high):  # recording: the plain rsqrt, and the largest value seen
        np.testing.assert_allclose(ranges.rsqrt(first, variance), 1 / np.sqrt(variance), rtol=1e-6)
    assert ranges.largest == {"block_0/norm1": pytest.approx(4000.0)}
    ranges.recording = False
    wide = (10.0 ** np.linspace(-3, 3.6, 50, dtype="float32")).reshape(1, 50, 1)
    np.testing.assert_allclose(ranges.rsqrt(first, wide), 1 / np.sqrt(wide), rtol=1e-5)
    assert ranges.largest == {"block_0/norm1": pytest.approx(4000.0)}  # applying records nothing
    with pytest.raises(ValueError, match=r"no calibrated variance range.*'block_0/norm2'"):
        ranges.rsqrt(second, low)


# ---- the traced full-integer graph equals Keras in float ---------------------------------------------------------

def assert_equals_keras(model, test, ranges):
    """The traced and the eager integer graph give Keras's scores on ``test``, in float."""
    reference = keras_scores(model, test)
    function = concrete_function(model, raw_pixels=True, variances=ranges)
    traced = np.concatenate([function(rgb(test[i:i + 1]))["scores"].numpy() for i in range(len(test))])
    assert np.abs(traced - reference).max() < 1e-4
    eager = forward(model, rgb(test), raw_pixels=True, variances=ranges).numpy()
    assert np.abs(eager - reference).max() < 1e-4


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_graph_with_variances_equals_keras(variant):
    model = tiny_model(**VARIANTS[variant])
    if variant == "lsa":
        for block in model.blocks:
            block.attn.logit_scale.assign(0.4)  # not the 1/sqrt(16) it starts at
    calibration, test = images(32, seed=1), images(8, seed=2)
    variances = IntegerRanges()
    forward(model, rgb(calibration), raw_pixels=True, variances=variances)  # eager: records each norm's range
    norms = (keras.layers.LayerNormalization, keras.layers.GroupNormalization)
    assert set(variances.largest) == {layer.path for layer in model._flatten_layers() if isinstance(layer, norms)}
    variances.recording = False
    assert_equals_keras(model, test, variances)


def massive_model():
    """A tiny ViT whose second block writes a "massive activation" (stream channel 3, made by MLP hidden unit 5)."""
    model = tiny_model(num_layers=2)
    block = model.blocks[1]
    fc1, fc2 = block.fc1.kernel.numpy(), block.fc2.kernel.numpy()
    fc1[:, 5] *= 60.0
    fc2[5, 3] = 40.0
    block.fc1.kernel.assign(fc1)
    block.fc2.kernel.assign(fc2)
    return model


def test_outlier_channels_get_their_own_scale_and_the_graph_stays_exact():
    """A stream channel and a hidden unit far above the rest: the stream keeps the channel scaled down, the MLP
    splits the unit off, and the traced and eager graphs still equal Keras."""
    model = massive_model()
    calibration, test = images(32, seed=1), images(8, seed=2)
    ranges = IntegerRanges()
    forward(model, rgb(calibration), raw_pixels=True, variances=ranges)
    assert ranges.stream_scale() is None  # nothing is applied while recording
    ranges.recording = False
    scale = ranges.stream_scale()
    assert scale is not None and scale[3] < 0.25 and np.sum(scale < 1) <= 2
    assert 5 in ranges.hidden_outliers(model.blocks[1].fc1)
    assert not len(ranges.hidden_outliers(model.blocks[0].fc1))
    assert_equals_keras(model, test, ranges)


# ---- the npu file ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def npu_file(tmp_path_factory):
    """A tiny ViT exported with target="npu" on the fewest calibration images allowed, and 16 held-out images."""
    model = tiny_model()
    folder = tmp_path_factory.mktemp("npu")
    path = folder / "npu.tflite"
    summary = tflite_export.export_tflite(model, path, quantize="int8", labels=LABELS, target="npu",
                                          calibration=images(MIN_CALIBRATION_IMAGES, seed=3),
                                          calibration_size=MIN_CALIBRATION_IMAGES)
    return types.SimpleNamespace(model=model, path=path, summary=summary, test=images(16, seed=4))


def test_npu_file_is_integer_from_uint8_pixels_to_int16_scores(npu_file):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(npu_file.path))
    (source,), (output,) = interpreter.get_input_details(), interpreter.get_output_details()
    assert source["dtype"] == np.uint8 and source["quantization"] == (1.0, 0)  # raw pixels
    assert list(source["shape"]) == [1, 28, 28, 3]
    assert output["dtype"] == np.int16 and list(output["shape"]) == [1, 10]
    assert npu_file.summary["input_dtype"] == "uint8" and npu_file.summary["input_quantization"] == (1.0, 0)
    assert flatbuffer.float_compute_ops(npu_file.path.read_bytes()) == []
    report = npu.npu_report(npu_file.path)
    assert report["full_integer"] and report["float_ops"] == {}
    assert {vendor: verdict["whole"] for vendor, verdict in report["vendors"].items()} == \
        {"Qualcomm": True, "MediaTek": True}, report["vendors"]
    assert tflite_metadata.read_labels(str(npu_file.path)) == LABELS
    mean, std = tflite_metadata.input_normalization(tflite_metadata.read_model_metadata(str(npu_file.path))[0])
    assert (mean, std) == ([0.0], [1.0])


def test_npu_file_agrees_with_keras(npu_file):
    """Measured on this seed: 16/16 top-1 agreement, mean abs score difference ~0.002 (scores are int16)."""
    reference = keras_scores(npu_file.model, npu_file.test)
    scores = tflite_scores(npu_file.path, npu_file.test)  # the int16 output dequantized
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=0.01)
    assert np.mean(scores.argmax(-1) == reference.argmax(-1)) >= 0.9
    assert np.abs(scores - reference).mean() < 0.01


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"plain"}))
def test_every_named_variant_exports_full_integer_and_agrees(variant, tmp_path):
    """The npu file of each variant the zoo exports (plain: ``npu_file``), GPTQ's levels included."""
    model, path, test = tiny_model(**VARIANTS[variant]), tmp_path / f"{variant}.tflite", images(8, seed=4)
    tflite_export.export_tflite(model, path, quantize="int8", labels=LABELS, target="npu",
                                calibration=images(MIN_CALIBRATION_IMAGES, seed=3),
                                calibration_size=MIN_CALIBRATION_IMAGES)
    assert flatbuffer.float_compute_ops(path.read_bytes()) == []
    reference = keras_scores(model, test)
    scores = tflite_scores(path, test)
    assert np.mean(scores.argmax(-1) == reference.argmax(-1)) >= 0.75
    assert np.abs(scores - reference).mean() < 0.02


def test_a_model_with_massive_activations_exports_whole_and_agrees(tmp_path):
    """The outlier channels' own tensors (SLICE, PAD, the MLP's split hidden units) stay integer and NPU-whole."""
    from ai_edge_litert.interpreter import Interpreter

    model, path, test = massive_model(), tmp_path / "massive.tflite", images(16, seed=4)
    tflite_export.export_tflite(model, path, quantize="int8", labels=LABELS, target="npu",
                                calibration=images(MIN_CALIBRATION_IMAGES, seed=3),
                                calibration_size=MIN_CALIBRATION_IMAGES)
    assert flatbuffer.float_compute_ops(path.read_bytes()) == []
    report = npu.npu_report(path)
    assert {vendor: verdict["whole"] for vendor, verdict in report["vendors"].items()} == \
        {"Qualcomm": True, "MediaTek": True}, report["vendors"]
    ops = [op["op_name"] for op in Interpreter(model_path=str(path))._get_ops_details()]
    assert "PAD" in ops  # the outlier channel put back in place at its true value
    assert ops.count("GELU") == 3  # block 0's, and block 1's for its ordinary and its outlier hidden units
    reference = keras_scores(model, test)
    scores = tflite_scores(path, test)
    assert np.mean(scores.argmax(-1) == reference.argmax(-1)) >= 0.9
    assert np.abs(scores - reference).mean() < 0.01


def test_compiled_model_reads_the_int16_scores_as_the_interpreter_does(npu_file):
    """ai-edge-litert's CompiledModel reads no int16 buffer; the runner reads its bytes (the npu file's output)."""
    interpreter = tflite_scores(npu_file.path, npu_file.test[:4])
    compiled = tflite_scores(npu_file.path, npu_file.test[:4], runtime="compiled")
    np.testing.assert_array_equal(interpreter, compiled)
    assert abs(float(interpreter.sum(-1).mean()) - 1.0) < 0.02  # softmax scores, dequantized


def test_a_file_left_with_float_ops_is_refused_by_name(npu_file, tmp_path, monkeypatch):
    """Never a file that claims to be full integer and isn't: the converter's output is checked op by op (here it
    is made to return a float32 file, as a model with an op that has no 16x8 kernel would leave float islands)."""
    float_path = tmp_path / "float32.tflite"
    tflite_export.export_tflite(npu_file.model, float_path, quantize="float32", labels=LABELS)
    monkeypatch.setattr(tflite, "raw_pixel_input", lambda model_bytes: float_path.read_bytes())
    with pytest.raises(ValueError, match=r"integer throughout.*ops compute in float: (CONV_2D|FULLY_CONNECTED|ADD)"):
        tflite_export.export_tflite(npu_file.model, tmp_path / "npu.tflite", quantize="int8", labels=LABELS,
                                    target="npu", calibration=images(MIN_CALIBRATION_IMAGES, seed=3),
                                    calibration_size=MIN_CALIBRATION_IMAGES)
    assert not (tmp_path / "npu.tflite").exists()


def test_verify_states_which_accelerators_run_each_file_whole(npu_file, tmp_path):
    from vit_keras.convert.verify import accelerator_note, accelerators, format_table, verify

    float_path = tmp_path / "float32.tflite"
    tflite_export.export_tflite(npu_file.model, float_path, quantize="float32", labels=LABELS)
    reference = keras_scores(npu_file.model, npu_file.test)
    rows = [verify(path, reference, None, npu_file.test, runs=2, runtimes=("interpreter",), threads=(1,))
            for path in (float_path, npu_file.path)]
    assert rows[1]["npu"]["full_integer"] and not rows[0]["npu"]["full_integer"]
    table = format_table(rows, threads=(1,), runtimes=("interpreter",))
    header, _, first, second = table.splitlines()
    columns = [cell.strip() for cell in header.split("|")]
    npu_column = columns.index("NPU")
    assert columns[-3:-1] == ["GPU delegate", "ops in float"]  # the columns other tests read by position
    assert first.split("|")[npu_column].strip().startswith("not full-integer (")
    assert second.split("|")[npu_column].strip() == "Qualcomm, MediaTek: whole"
    assert accelerators(rows[1])[0] == "CPU" and accelerators(rows[1])[-1] == "NPU (Qualcomm, MediaTek)"
    assert "NPU" not in " ".join(accelerators(rows[0]))
    assert accelerator_note(rows).startswith("Runs whole on: float32.tflite: CPU")


# ---- bad input ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vit_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vit")
    tiny_model().save(folder / "model.keras")
    (folder / "labels.txt").write_text("\n".join(LABELS))
    return folder / "model.keras"


@pytest.mark.parametrize("options, message", [
    (dict(target="gpu", quantize="int8"), r"Unknown `target`='gpu' \(--target\); valid values are cpu, npu"),
    (dict(target="npu", quantize="dynamic"), r"`quantize`='int8' \(--quantize int8\), not 'dynamic'"),
    (dict(target="npu", quantize="float32"), r"--quantize int8"),
    (dict(target="npu", quantize="int8", dynamic_batch=True), r"`dynamic_batch` \(--dynamic-batch\) does not apply"),
    (dict(target="npu", quantize="int8", attention_output=True),
     r"`attention_output` \(--attention-output\) does not apply"),
    (dict(target="npu", quantize="int8", int8_activations="static"), r"`int8_activations` \(--int8-activations\)"),
    (dict(target="npu", quantize="int8", ranges="minmax"), r"`ranges` \(--ranges\) does not apply"),
])
def test_bad_target_options_fail_before_anything_loads(vit_file, tmp_path, options, message):
    assert EXPORT_TARGETS == ("cpu", "npu")
    with pytest.raises(ValueError, match=message):
        tflite_export.export_tflite(tmp_path / "never-read.keras", tmp_path / "m.tflite", calibration=images(100),
                                    **options)
    assert list(tmp_path.iterdir()) == []


def test_cli_export_target(vit_file, tmp_path, capsys):
    out = tmp_path / "m.tflite"
    assert cli.main(["export", str(vit_file), "--target", "npu", "--quantize", "float16", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "vit-keras export: error:" in error and "--target npu" in error and "--quantize int8" in error
    assert cli.main(["export", str(vit_file), "--target", "npu", "--calibration", "fashion_mnist",
                     "--dynamic-batch", "--out", str(out)]) == 2
    assert "--dynamic-batch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices
        cli.main(["export", str(vit_file), "--target", "gpu", "--out", str(out)])
    assert exit_info.value.code == 2 and "invalid choice: 'gpu'" in capsys.readouterr().err
    assert not out.exists()


def test_cli_export_passes_the_target(vit_file, tmp_path, capsys, monkeypatch):
    seen = {}

    def fake_export(model, out, **options):
        seen.update(options)
        return {"path": str(out), "bytes": 1, "quantize": options["quantize"], "input_dtype": "uint8",
                "input_shape": [1, 28, 28, 3], "labels": 10, "runtime": "TFLite >= 2.9.0"}

    monkeypatch.setattr(tflite_export, "export_tflite", fake_export)
    out = tmp_path / "m.tflite"
    assert cli.main(["export", str(vit_file), "--target", "npu", "--calibration", "fashion_mnist",
                     "--calibration-size", str(MIN_CALIBRATION_IMAGES), "--out", str(out)]) == 0
    assert seen["target"] == "npu" and seen["quantize"] == "int8"
    assert "int8, npu target" in capsys.readouterr().out
    assert cli.main(["export", str(vit_file), "--quantize", "float32", "--out", str(out)]) == 0
    assert seen["target"] == "cpu"
