"""Right answers on every runtime a file ships to: no operand the GPU delegate reads in the wrong orientation, the
GPU check's known bugs, and each export mode under the oldest TFLite runtime it claims to run on."""

import os
import subprocess

import numpy as np
import pytest

import vit_keras  # noqa: F401  (registers the layers before keras loads a model)

from app_models import train_fashion_run
from vit_keras.constants import COMPAT_DIR, COMPAT_RUNTIMES, QUANTIZATIONS
from vit_keras.convert import export as tflite_export
from vit_keras.convert import tflite
from vit_keras.convert.flatbuffer import builtin_code
from vit_keras.convert.gpu_delegate import gpu_report
from vit_keras.convert.metadata import read_min_runtime_version
from vit_keras.convert.runtime_version import describe, required_runtime, runs_under

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "old_runtime_worker.py")
REFUSED = 3  # the worker's exit status where the runtime refuses the file


@pytest.fixture(scope="module")
def files(tmp_path_factory, fashion_train):
    """{mode: .tflite} of the tiny Fashion-MNIST ViT (class token, 2 heads; its last block reads the class token
    alone, so q.k^T there is (1 x 17): the shape LiteRT#6518 refuses as adj_y), fitted on 2000 images."""
    images, labels = fashion_train
    folder = tmp_path_factory.mktemp("runtimes")
    train_fashion_run(folder, images[:2000], labels[:2000], batch_size=100, epochs=2)
    paths = {}
    for mode in QUANTIZATIONS:
        paths[mode] = folder / f"{mode}.tflite"
        tflite_export.export_tflite(folder / "model.keras", paths[mode], quantize=mode, calibration=images[:200],
                                    calibration_size=200)
    return paths


def matmul_flags(path):
    """[(adj_x, adj_y)] of every BATCH_MATMUL in a .tflite file, read with the flatbuffer schema alone."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(open(path, "rb").read(), 0)
    flags = []
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            if builtin_code(code) == schema.BuiltinOperator.BATCH_MATMUL:
                options = schema.BatchMatMulOptions()
                options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
                flags.append((options.AdjX(), options.AdjY()))
    return flags


def test_no_batch_matmul_reads_an_operand_transposed_in_any_mode(files, fashion_test):
    """Every mode: BATCH_MATMULs (q.k^T and weights.v over all heads, two a block) with neither adj_x nor adj_y, nothing the GPU
    check flags; float32 still within 1e-5 of Keras."""
    from vit_keras.convert.graph import keras_scores
    from vit_keras.convert.runtime import tflite_scores

    for mode, path in files.items():
        flags = matmul_flags(path)
        assert len(flags) == 2 and not any(x or y for x, y in flags), (mode, flags)
        report = gpu_report(path)
        assert report["wrong"] == {} and report["refused"] == {}, (mode, report)
    model = tflite.load_vit(files["float32"].parent / "model.keras")
    images = fashion_test[0][:50]
    assert np.abs(tflite_scores(files["float32"], images) - keras_scores(model, images)).max() < 1e-5


def converted(function):
    import tensorflow as tf

    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()


def test_explicit_transposes_keep_every_value_and_the_gpu_check_names_the_flags(tmp_path):
    """A graph with adj_x and adj_y (the converter folds a transpose into them): the GPU check names them with
    LiteRT#8913, and the class-token shape (M=1 < N=17, 17 not a multiple of 4) as refused with LiteRT#6518;
    explicit_transposes gives the same outputs with no flag left and nothing flagged."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from vit_keras.convert.transposes import adjoint_matmuls, explicit_transposes

    @tf.function(input_signature=[tf.TensorSpec((1, 17, 8), tf.float32), tf.TensorSpec((1, 8, 17), tf.float32)])
    def flagged(k, kt):
        query = k[:, :1] * 2.0  # (1, 1, 8): the class token's query
        return {"readout": tf.matmul(query, k, transpose_b=True), "both": tf.matmul(kt, k, transpose_a=True,
                                                                                    transpose_b=True)}

    before = converted(flagged)
    assert sorted(flag for *_, flag in adjoint_matmuls(before)) == ["adj_x", "adj_y", "adj_y"]
    (tmp_path / "before.tflite").write_bytes(before)
    report = gpu_report(tmp_path / "before.tflite")
    assert report["wrong"] == {"BATCH_MATMUL adj_x": 1, "BATCH_MATMUL adj_y": 2}
    assert report["issues"]["BATCH_MATMUL adj_y"] == "LiteRT#8913"
    assert report["refused"] == {"BATCH_MATMUL": 1} and report["reasons"]["BATCH_MATMUL"] == [
        "adj_y with M=1 < N=17, N not a multiple of 4"]
    after = explicit_transposes(before)
    assert adjoint_matmuls(after) == [] and explicit_transposes(after) == after
    (tmp_path / "after.tflite").write_bytes(after)
    fixed = gpu_report(tmp_path / "after.tflite")
    assert fixed["wrong"] == {} and fixed["refused"] == {}
    rng = np.random.default_rng(0)
    k, kt = rng.normal(size=(1, 17, 8)).astype("float32"), rng.normal(size=(1, 8, 17)).astype("float32")
    outputs = []
    for data in (before, after):
        interpreter = Interpreter(model_content=data)
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():  # named after the function's arguments
            interpreter.set_tensor(detail["index"], kt if detail["name"].endswith("kt") else k)
        interpreter.invoke()
        outputs.append({tuple(d["shape"]): interpreter.get_tensor(d["index"])
                        for d in interpreter.get_output_details()})
    for shape in ((1, 1, 17), (1, 17, 17)):  # the readout, and the product with both flags
        np.testing.assert_allclose(outputs[1][shape], outputs[0][shape], rtol=1e-6)
    np.testing.assert_allclose(outputs[1][1, 1, 17], (k[:, :1] * 2) @ k.transpose(0, 2, 1), rtol=1e-5)
    np.testing.assert_allclose(outputs[1][1, 17, 17], kt.transpose(0, 2, 1) @ k.transpose(0, 2, 1), rtol=1e-5)


def test_verify_names_the_known_bugs_in_its_gpu_column(tmp_path):
    from vit_keras.convert.verify import gpu_cell

    report = {"gpu_refused": {"BATCH_MATMUL": 1}, "gpu_wrong": {"BATCH_MATMUL adj_y": 12},
              "gpu_reasons": {"BATCH_MATMUL": ["adj_y with M=1 < N=17, N not a multiple of 4"]},
              "gpu_issues": {"BATCH_MATMUL adj_y": "LiteRT#8913",
                             "adj_y with M=1 < N=17, N not a multiple of 4": "LiteRT#6518"}}
    assert gpu_cell(report) == ("computes wrongly: BATCH_MATMUL adj_y, LiteRT#8913 (12 ops); "
                                "refuses: BATCH_MATMUL 1, LiteRT#6518")
    assert gpu_cell({"gpu_refused": {}, "gpu_wrong": {}}) == "none"


def test_export_records_the_oldest_runtime_and_keeps_three_modes_on_tflite_2_14(files):
    """The file's "min_runtime_version" is what its op versions need. float32, float16 and int8 run on TFLite 2.14
    (tflite-runtime's last release); dynamic's per-channel hybrid FULLY_CONNECTED (v12) needs 2.17."""
    for mode, path in files.items():
        requirement = required_runtime(path)
        assert read_min_runtime_version(path) == requirement["version"] and not requirement["unknown"], mode
        assert runs_under(requirement, "2.14.0") == (mode != "dynamic"), (mode, requirement)
    assert required_runtime(files["dynamic"])["limiting"] == ["FULLY_CONNECTED v12"]
    assert describe(required_runtime(files["dynamic"])) == "TFLite >= 2.17.0 (ai-edge-litert >= 1.0.1)"


def test_an_op_version_no_table_knows_is_unknown_not_guessed(files):
    from vit_keras.convert.metadata import pack_model, unpack_model

    model = unpack_model(files["float32"].read_bytes())
    for code in model.operatorCodes:
        if code.builtinCode == 9:  # FULLY_CONNECTED
            code.version = 99
    requirement = required_runtime(pack_model(model))
    assert requirement["version"] is None and requirement["unknown"] == ["FULLY_CONNECTED v99"]
    assert describe(requirement) == "unknown: no release known for FULLY_CONNECTED v99"
    assert runs_under(requirement, "2.14.0") is None


@pytest.mark.parametrize("content", [b"", b"garbage, not a model", b"\0\0\0\0TFL3" + b"\xff" * 40])
def test_the_gpu_and_runtime_checks_refuse_what_is_no_tflite_model(tmp_path, content):
    path = tmp_path / "model.tflite"
    path.write_bytes(content)
    for check in (gpu_report, required_runtime):
        with pytest.raises(ValueError, match="not a (readable )?TFLite model"):
            check(path)
    with pytest.raises(FileNotFoundError, match="`tflite` file .* does not exist"):
        gpu_report(tmp_path / "missing.tflite")


def test_verify_refuses_a_model_with_no_image_input(tmp_path):
    import tensorflow as tf

    from vit_keras.convert.verify import check_image_classifier, verify_files

    @tf.function(input_signature=[tf.TensorSpec((1, 20), tf.float32)])
    def vector(x):
        return tf.nn.softmax(x * 2.0)

    path = tmp_path / "vector.tflite"
    path.write_bytes(converted(vector))
    with pytest.raises(ValueError, match=r"has no image input \(inputs: \[\(1, 20\)\]\)"):
        check_image_classifier(path)
    with pytest.raises(ValueError, match="has no image input"):
        verify_files([str(path)], str(tmp_path / "never-read.keras"), "fashion_mnist")
    assert gpu_report(path)["ops"] == 2  # the static op check still reads any model


def run_worker(python, module, path, inputs, tmp_path):
    np.save(tmp_path / "inputs.npy", inputs)
    return subprocess.run([python, WORKER, module, str(path), str(tmp_path / "inputs.npy"),
                           str(tmp_path / "scores.npy")], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("package, release, carries, module", COMPAT_RUNTIMES)
def test_each_mode_under_the_oldest_runtime_it_claims(files, fashion_test, tmp_path, package, release, carries,
                                                      module):
    """Where the file says this runtime is new enough, it gives the current runtime's top-1 (near-ties aside);
    where it says too old, the runtime refuses to load it, naming the op version."""
    from vit_keras.convert.runtime import model_input, tflite_scores, prepare

    python = os.path.join(ROOT, COMPAT_DIR, f"{package}-{release}", "bin", "python")
    if not os.path.exists(python):
        pytest.skip(f"{package} {release} is not installed in {COMPAT_DIR}/ (scripts/setup.sh makes it there)")
    images = fashion_test[0][:200]
    for mode, path in files.items():
        requirement = required_runtime(path)
        dtype, _, norm = model_input(path)
        result = run_worker(python, module, path, prepare(images, dtype, norm), tmp_path)
        if not runs_under(requirement, carries):
            op, version = requirement["limiting"][0].split(" v")
            assert result.returncode == REFUSED, (mode, result.stderr[-2000:])
            assert f"'{op}' version '{version}'" in result.stderr, result.stderr[-2000:]
            continue
        assert result.returncode == 0, (mode, result.stderr[-2000:])
        theirs, ours = np.load(tmp_path / "scores.npy"), tflite_scores(path, images)
        top2 = np.sort(ours, axis=-1)[:, -2:]
        # tflite-runtime 2.14's int8 kernels round a little differently (scores up to 0.02 apart, measured): a near-tie
        # may go either way, a decision may not.
        decided = top2[:, 1] - top2[:, 0] > 0.05
        assert np.all(theirs.argmax(-1)[decided] == ours.argmax(-1)[decided]), mode
        assert np.mean(theirs.argmax(-1) == ours.argmax(-1)) >= 0.98, mode


def test_prepare_quantizes_an_integer_input_by_its_scale_and_zero_point():
    """An int8 or int16 input (ai-edge-quantizer's static files) takes the normalized pixels quantized with the
    input's own scale and zero point, not raw pixels cast to its type; a raw uint8 input takes the pixels as they are."""
    from vit_keras.convert.runtime import prepare

    pixels = np.array([[[[0, 128, 255]]]], np.uint8)
    raw = prepare(pixels, np.uint8, ([0.0], [1.0]), quantization=(1.0, 0))
    assert raw.dtype == np.uint8 and raw.tolist() == pixels.tolist()
    int16 = prepare(pixels, np.int16, ([0.0], [1.0]), quantization=(0.01, 0))
    assert int16.dtype == np.int16 and int16.ravel().tolist() == [0, 12800, 25500]
    int8 = prepare(pixels, np.int8, ([127.5], [127.5]), quantization=(1 / 127.5, -1))
    assert int8.ravel().tolist() == [-128, -1, 126]  # (x - 127.5) / 127.5 / scale + zero, clipped to int8
    with pytest.raises(ValueError, match="no quantization scale"):
        prepare(pixels, np.int8, ([0.0], [1.0]))
