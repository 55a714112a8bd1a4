"""Dynamic int8 (convert/dynamic_int8.py): int8 weights, each dense input rounded a row at a time as it runs."""

import types

import numpy as np
import pytest

import vit_keras
from vit_keras.convert import dynamic_int8
from vit_keras.convert.export import export_tflite
from vit_keras.convert.graph import keras_scores
from vit_keras.convert.int8 import DYNAMIC_MIN_WIDTH, resolve_int8
from vit_keras.convert.runtime import delegation_report, op_precisions, tflite_scores

CLASSES = [f"c{i}" for i in range(10)]


@pytest.fixture(scope="module")
def dynamic_file(tmp_path_factory):
    """A tiny random ViT with token pooling (its last block computes the class token alone) in dynamic int8."""
    folder = tmp_path_factory.mktemp("dynamic")
    model = vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64,
                                   num_layers=2, num_classes=10, include_preprocessing=True)
    images = np.random.default_rng(0).integers(0, 256, (150, 32, 32, 3), dtype=np.uint8)
    path = folder / "int8.tflite"
    summary = export_tflite(model, path, quantize="int8", labels=CLASSES, calibration=images[:120],
                            calibration_size=120, int8_activations="dynamic")
    return model, path, summary, images[120:]


def test_dynamic_int8_takes_raw_uint8_pixels_and_runs_in_one_xnnpack_partition(dynamic_file):
    model, path, summary, test = dynamic_file
    assert summary["input_dtype"] == "uint8" and summary["input_quantization"] == (1.0, 0)
    report = delegation_report(path)
    assert report["partitions"] == 1 and not report["fallback"]
    assert np.abs(tflite_scores(path, test) - keras_scores(model, test)).max() < 0.05


def test_dense_layers_multiply_in_int8_but_those_reading_one_row(dynamic_file):
    """Block 0's four dense layers and block 1's k-and-v projection read every token: int8 products. Block 1's q
    projection, output projection and MLP read the class token alone, and the head one row: float products from
    int8 weights, unpacked once at load. The convs keep float16 weights."""
    from ai_edge_litert import schema_py_generated as schema

    _, path, _, _ = dynamic_file
    float_ops, integer_ops = op_precisions(path)
    assert integer_ops == {"FULLY_CONNECTED": 4 + 1}
    assert float_ops["FULLY_CONNECTED"] == 1 + 3 + 1 and float_ops["CONV_2D"] == 1
    graph = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0).subgraphs[0]
    types_ = [tensor.type for tensor in graph.tensors]
    assert types_.count(schema.TensorType.INT8) == 4 + 1 + 5  # every dense kernel is stored in int8
    assert schema.TensorType.FLOAT16 in types_


def test_auto_is_dynamic_from_vit_ti_width_up_unless_a_static_option_is_given():
    def model(width):
        return types.SimpleNamespace(vit_config={"hidden_size": width})

    assert resolve_int8(model(DYNAMIC_MIN_WIDTH), "auto") == ("dynamic", None, None)
    assert resolve_int8(model(DYNAMIC_MIN_WIDTH - 1), "auto")[0] == "static"
    assert resolve_int8(model(768), "auto", ranges="minmax")[0] == "static"
    assert resolve_int8(model(768), "auto", min_agreement=0.99)[0] == "static"
    assert resolve_int8(model(32), "dynamic") == ("dynamic", None, None)
    with pytest.raises(ValueError, match=r"`ranges` \(--ranges\) applies to static int8"):
        resolve_int8(model(768), "dynamic", ranges="mse")


def test_rounding_with_the_inputs_statistics_changes_the_layer_output_least():
    """GPTQ-style rounding keeps int8's levels and scales, and gives a smaller output error over correlated inputs
    than rounding each weight to its nearest level."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 48)) @ rng.normal(size=(48, 48))  # correlated input channels
    w = rng.normal(size=(24, 48)).astype(np.float32)  # (out, in), as FULLY_CONNECTED stores it
    nearest, scale = dynamic_int8.quantize_rows(w)
    compensated, same_scale = dynamic_int8.quantize_rows(w, x.T @ x)
    np.testing.assert_array_equal(scale, same_scale)
    assert np.abs(compensated.astype(int)).max() <= dynamic_int8.WEIGHT_LEVELS

    def error(levels):
        return np.sum((x @ (levels * scale[:, None]).T - x @ w.T) ** 2)

    assert error(compensated) < 0.7 * error(nearest)


def test_per_layer_report_of_a_dynamic_file_lists_its_run_time_rounding(dynamic_file):
    from vit_keras.convert.quant_report import layer_errors

    model, path, _, test = dynamic_file
    rows, summary = layer_errors(path, test[:4], keras_scores(model, test[:4]))
    assert len(rows) >= 4 and all(row["tensor"].endswith("(per row at run time)") for row in rows)
    assert 0 <= summary["int8_vs_reference"] <= 1
