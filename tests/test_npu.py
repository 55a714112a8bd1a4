"""convert/npu.py on tiny real .tflite files: float, full int8, 16x8, and a graph with an op one NPU plugin lacks."""

import numpy as np
import pytest

from vit_keras.convert.npu import MEDIATEK_OPS, QUALCOMM_OPS, Tensor, float_ops, npu_cell, npu_report, type_refusal

MODES = ("float", "int8", "16x8", "int8 float io")


def convert(function, mode):
    """``function`` as .tflite bytes in ``mode``: float32; full int8 (int8 in and out, or float in and out);
    or 16x8 (int16 activations, int8 weights, int16 in and out)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], function)
    if mode != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            [np.random.RandomState(i).rand(2, 8).astype(np.float32)] for i in range(8))
    if mode.startswith("int8"):
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if mode == "int8":
        converter.inference_input_type = converter.inference_output_type = tf.int8
    if mode == "16x8":
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int16
    return converter.convert()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{(graph, mode): path}: "dense" is FULLY_CONNECTED + SOFTMAX; "gather" puts a GATHER between them."""
    import tensorflow as tf

    weights = tf.constant(np.random.RandomState(0).randn(8, 4).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([2, 8], tf.float32)])
    def dense(x):
        return tf.nn.softmax(tf.matmul(x, weights) + 1.0)

    @tf.function(input_signature=[tf.TensorSpec([2, 8], tf.float32)])
    def gather(x):
        return tf.nn.softmax(tf.gather(tf.matmul(x, weights), [0, 2], axis=1))

    folder, paths = tmp_path_factory.mktemp("npu"), {}
    for name, function in (("dense", dense), ("gather", gather)):
        for mode in MODES:
            paths[name, mode] = folder / f"{name}_{mode.replace(' ', '_')}.tflite"
            paths[name, mode].write_bytes(convert(function, mode))
    return paths


def test_a_float_file_is_not_full_integer_and_names_its_float_ops(files):
    report = npu_report(files["dense", "float"])
    assert not report["full_integer"]
    assert report["float_ops"] == {"FULLY_CONNECTED": 1, "SOFTMAX": 1} == float_ops(files["dense", "float"])
    for verdict in report["vendors"].values():  # both ops are in both plugins' lists: refused for float alone
        assert not verdict["whole"] and verdict["refused"] == {"FULLY_CONNECTED": 1, "SOFTMAX": 1}
        assert all(why == ["computes in float (NPUs take statically quantized integer graphs)"]
                   for why in verdict["reasons"].values())
    assert npu_cell(report) == "not full-integer (2 float ops: FULLY_CONNECTED ×1, SOFTMAX ×1)"


@pytest.mark.parametrize("mode", ["int8", "16x8"])
def test_int8_and_16x8_files_run_whole_on_both_npus(files, mode):
    assert {"FULLY_CONNECTED", "SOFTMAX"} <= QUALCOMM_OPS & MEDIATEK_OPS
    report = npu_report(files["dense", mode])
    assert report["full_integer"] and report["float_ops"] == {} and report["ops"] == 2
    assert {vendor: verdict["whole"] for vendor, verdict in report["vendors"].items()} == \
        {"Qualcomm": True, "MediaTek": True}
    assert npu_cell(report) == "Qualcomm, MediaTek: whole"


def test_float_input_and_output_of_an_int8_graph_are_float_ops(files):
    """The converter's QUANTIZE of a float input and DEQUANTIZE of the output compute in float."""
    report = npu_report(files["dense", "int8 float io"])
    assert report["float_ops"] == {"QUANTIZE": 1, "DEQUANTIZE": 1} and not report["full_integer"]
    assert report["vendors"]["MediaTek"]["refused"] == {"QUANTIZE": 1, "DEQUANTIZE": 1}


@pytest.mark.parametrize("mode", ["int8", "16x8"])
def test_an_op_outside_mediateks_list_is_refused_by_name(files, mode):
    """GATHER has a QNN builder but is not in MediaTek's kSupportedOps."""
    assert "GATHER" in QUALCOMM_OPS and "GATHER" not in MEDIATEK_OPS
    report = npu_report(files["gather", mode])
    assert report["full_integer"]
    qualcomm, mediatek = report["vendors"]["Qualcomm"], report["vendors"]["MediaTek"]
    assert qualcomm["whole"] and qualcomm["refused"] == {}
    assert not mediatek["whole"] and mediatek["refused"] == {"GATHER": 1}
    assert mediatek["reasons"] == {"GATHER": ["not an op the plugin legalizes"]}
    assert npu_cell(report) == "Qualcomm: whole; MediaTek: refuses GATHER ×1"


def test_tensor_type_rules_per_vendor():
    """MediaTek's GetNeuronTensorType takes int16 per-tensor only, int8 quantized only, int64 as a constant only;
    Qualcomm's ConvertDataType maps all three, and neither maps bfloat16 or block-wise quantization."""
    cases = {Tensor("INT16", "per-tensor", True, False): (None, None),
             Tensor("INT16", "per-channel", True, False): (None, "INT16 per-channel (takes per-tensor)"),
             Tensor("INT8", "none", True, False): (None, "INT8 unquantized (takes per-channel or per-tensor)"),
             Tensor("INT64", "per-channel", True, True): (None, None),
             Tensor("INT64", "none", True, False): (None, "INT64 computed at run time (constants only)"),
             Tensor("INT32", "per-channel", False, True): (None, "INT32 per-channel with non-zero zero points"),
             Tensor("BFLOAT16", "none", True, False): ("no QNN type for BFLOAT16", "no Neuron type for BFLOAT16"),
             Tensor("INT8", "blockwise", True, True): ("block-wise quantization",
                                                       "INT8 blockwise (takes per-channel or per-tensor)")}
    for tensor, (qualcomm, mediatek) in cases.items():
        assert (type_refusal("Qualcomm", tensor), type_refusal("MediaTek", tensor)) == (qualcomm, mediatek), tensor


def test_a_file_that_is_no_model_is_a_clear_error(tmp_path):
    path = tmp_path / "not.tflite"
    path.write_bytes(b"not a flatbuffer at all")
    with pytest.raises(ValueError, match="not a TFLite model"):
        npu_report(path)
