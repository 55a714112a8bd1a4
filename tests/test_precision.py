"""Inference in bfloat16 and int8 (vit_keras.inference.precision): twins, refusals, the agreement check."""

import warnings

import keras
import numpy as np
import pytest

import vit_keras
from vit_keras.cpu import CpuFeatures
from vit_keras.inference import precision as precision_module
from vit_keras.inference.precision import AGREEMENTS, resolve, twin

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, num_classes=5,
            include_preprocessing=False)
BF16_CPU = CpuFeatures("a CPU with bf16 units", 2, frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}))
AVX2_CPU = CpuFeatures("an AVX2-only CPU", 2, frozenset({"avx2"}))


def tiny(**kwargs):
    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", **{**TINY, **kwargs})
    if model.head is not None:  # distinct logits, so top-1 agreement means something
        model.head.kernel.assign(np.random.default_rng(1).normal(0, 2.0, model.head.kernel.shape))
    return model


def images(count=12, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (count, 32, 32, 3)).astype("float32")


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This machine seen as one with bf16 units, so the bfloat16 path runs on every CPU the suite meets."""
    monkeypatch.setattr(precision_module, "cpu_features", lambda: BF16_CPU)


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_a_lower_precision_predicts_close_to_float32_and_records_its_agreement(bf16_cpu, precision):
    model, x = tiny(), images()
    expected = vit_keras.predict(model, x, batch_size=6)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*precision.*")  # neither refused nor fallen back
        got = vit_keras.predict(model, x, batch_size=6, precision=precision)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=0.15 * np.abs(expected).max())
    assert AGREEMENTS[model][precision].kept and AGREEMENTS[model][precision].images == 12
    assert vit_keras.predict(model, x, batch_size=6, precision=precision) == pytest.approx(got)
    assert twin(model, precision) is twin(model, precision)  # one twin a model and precision


def test_the_twins_hold_the_weights_in_their_precision():
    model = tiny()
    bf16, int8 = twin(model, "bfloat16"), twin(model, "int8")
    assert twin(model, "float32") is model
    assert bf16.blocks[0].attn.qkv.kernel.dtype == "bfloat16" and bf16.head.compute_dtype == "float32"
    np.testing.assert_allclose(np.asarray(bf16.blocks[0].fc1.kernel, "float32"), model.blocks[0].fc1.kernel,
                               rtol=1e-2, atol=1e-3)
    quantized = [layer for layer in int8._flatten_layers() if isinstance(layer, keras.layers.Dense)]
    assert quantized and all(layer.quantization_mode == "int8" for layer in quantized)
    assert keras.mixed_precision.dtype_policy().name == "float32"  # the bf16 rebuild restored the global policy
    assert not model.blocks[0].fc1.quantization_mode  # the user's model is untouched


def test_bfloat16_on_a_cpu_without_bf16_units_says_so_and_runs_float32(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_features", lambda: AVX2_CPU)
    model, x = tiny(), images(4)
    with pytest.warns(UserWarning, match=r"`precision`='bfloat16' would run slower.*AVX2-only CPU.*using float32"):
        got = vit_keras.predict(model, x, precision="bfloat16")
    np.testing.assert_array_equal(got, vit_keras.predict(model, x))


def test_bfloat16_under_jax_on_a_cpu_says_so_and_runs_float32(monkeypatch):
    monkeypatch.setattr(precision_module.keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(precision_module, "accelerator_count", lambda: 0)
    with pytest.warns(UserWarning, match="XLA's CPU dot does not use the bf16 units"):
        assert resolve("bfloat16", cpu=BF16_CPU) == ("float32", True)
    assert resolve("int8", cpu=BF16_CPU) == ("int8", True)
    monkeypatch.setattr(precision_module, "accelerator_count", lambda: 1)  # a GPU or TPU computes bf16 itself
    assert resolve("bfloat16", cpu=AVX2_CPU)[0] == "bfloat16"


def test_int8_asked_without_xla_says_so_and_runs_float32():
    with pytest.warns(UserWarning, match="only compiled by XLA"):
        assert resolve("int8", jit_compile=False, cpu=BF16_CPU) == ("float32", False)
    assert resolve("bfloat16", jit_compile=True, cpu=BF16_CPU) == ("bfloat16", False)  # TensorFlow's oneDNN kernel


def test_int8_on_a_cpu_without_int8_dot_products_says_so_and_runs_float32(monkeypatch):
    """AVX2 alone (no VNNI, no AMX-INT8): Keras's int8 layers compiled by XLA ran no faster than float32 there."""
    monkeypatch.setattr(precision_module, "accelerator_count", lambda: 0)
    with pytest.warns(UserWarning, match=r"no int8 dot-product units \(VNNI or AMX-INT8\).*using float32"):
        assert resolve("int8", cpu=AVX2_CPU) == ("float32", True)
    monkeypatch.setattr(precision_module, "cpu_features", lambda: AVX2_CPU)
    model, x = tiny(), images()
    with pytest.warns(UserWarning, match="no int8 dot-product units"):
        got = vit_keras.predict(model, x, batch_size=6, precision="int8")
    np.testing.assert_array_equal(got, vit_keras.predict(model, x, batch_size=6))
    assert "int8" not in AGREEMENTS.get(model, {})  # refused: no twin ran


def test_a_precision_that_disagrees_with_float32_warns_with_the_figure_and_falls_back(bf16_cpu, monkeypatch):
    monkeypatch.setattr(precision_module, "AGREEMENT_FLOOR", 1.01)  # nothing can keep it
    model, x = tiny(), images()
    expected = vit_keras.predict(model, x, batch_size=6)
    with pytest.warns(UserWarning, match=r"'int8' agreed with float32 on 100\.0% of the first 6 images.*using float32"):
        got = vit_keras.predict(model, x, batch_size=6, precision="int8")
    np.testing.assert_allclose(got, expected, atol=1e-5)  # every batch, the first included, in float32
    assert "precision: float32 (int8's top-1 agreement with float32 on the first 6 images" in \
        precision_module.precision_line(model, "int8")


def test_bad_precision_requests_are_named():
    with pytest.raises(ValueError, match="`precision`.*'float32', 'bfloat16', 'int8'"):
        vit_keras.predict(tiny(), images(2), precision="fp8")
    with pytest.raises(ValueError, match="needs a classifier"):
        twin(tiny(include_top=False), "int8")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="needs a vit_keras VisionTransformer.*Sequential"):
        twin(plain, "bfloat16")
    quantized = tiny()
    quantized.quantize("int8")
    with pytest.raises(ValueError, match="already quantized"):
        twin(quantized, "bfloat16")


def test_evaluate_and_bench_run_the_lower_precisions(bf16_cpu, monkeypatch):
    from vit_keras.inference import bench
    from vit_keras.training.evaluation import evaluate_arrays

    model = tiny()
    pixels = np.random.default_rng(3).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    labels, names = np.arange(8) % 5, [str(i) for i in range(5)]
    exact = evaluate_arrays(model, pixels, labels, names, batch_size=4)
    result = evaluate_arrays(model, pixels, labels, names, batch_size=4, precision="int8")
    assert AGREEMENTS[model]["int8"].kept and AGREEMENTS[model]["int8"].images == 8
    assert result["loss"] == pytest.approx(exact["loss"], rel=0.1) and result["examples"] == 8
    monkeypatch.setattr(bench, "resolve", lambda p, jit: resolve(p, jit, cpu=BF16_CPU))
    monkeypatch.setattr(bench, "create_model", lambda name, **options: tiny(**options))  # ViT-Ti's 12 blocks: slow
    rates = bench.keras_throughput("vit_ti16", batch=2, image_size=32, repeats=1)
    assert set(rates) == set(bench.MODES) and all(rate > 0 for rate in rates.values())


def test_training_in_mixed_bfloat16_without_bf16_units_falls_back_to_float32():
    from vit_keras.training.optimizer import fast_precision

    precision, why = fast_precision("mixed_bfloat16", AVX2_CPU, accelerators=0)
    assert precision == "float32" and "AVX2-only CPU" in why and "no bfloat16 units" in why
    assert fast_precision("mixed_bfloat16", BF16_CPU, accelerators=0) == ("mixed_bfloat16", None)
    assert fast_precision("mixed_bfloat16", AVX2_CPU, accelerators=1) == ("mixed_bfloat16", None)  # a GPU has them
    assert fast_precision("float32", AVX2_CPU, accelerators=0) == ("float32", None)


def test_the_check_counts_images_until_it_has_enough_and_warns_once_under_the_floor():
    from vit_keras.inference.precision import CHECK_IMAGES, Agreement

    logits = np.eye(4, dtype="float32")[[0, 1, 2, 3] * 4]  # 16 images, classes 0-3
    agreement = Agreement()
    assert agreement.kept and not agreement.settled
    assert not agreement.add(logits, logits)  # all 16 agree
    assert agreement.images == 16 and agreement.kept and not agreement.settled
    flipped = logits[:, ::-1]
    assert agreement.add(flipped, logits)  # now 50%: under the floor, once
    assert not agreement.kept and agreement.settled and agreement.value == 0.5
    assert not agreement.add(flipped, logits)  # already under: no second warning
    assert "agreed with float32 on 33.3% of the first 48 images" in agreement.describe("int8")
    enough = Agreement()
    for _ in range(CHECK_IMAGES // 16):
        enough.add(logits, logits)
    assert enough.settled and enough.kept


def test_served_times_a_child_process_path_on_request_and_names_why_it_could_not_start(tmp_path):
    import sys

    from vit_keras.inference.served import Served, in_turns

    server = tmp_path / "server.py"
    server.write_text("import json, sys, time\nprint('a runtime line of its own')\n"
                      "print(json.dumps({'names': ['sleepy']}), flush=True)\n"
                      "for line in sys.stdin:\n"
                      "    start = time.perf_counter(); time.sleep(0.05)\n"
                      "    print(json.dumps(time.perf_counter() - start), flush=True)\n")
    served = Served([sys.executable, str(server)])
    try:
        assert served.info == {"names": ["sleepy"]}
        assert all(0.05 <= served.seconds("sleepy") < 1 for _ in range(3))
        calls = []
        local = lambda: calls.append("local") or 0.01  # noqa: E731
        times = in_turns({"sleepy": lambda: served.seconds("sleepy"), "local": local}, rounds=2, warm_call=True)
        assert len(times["sleepy"]) == len(times["local"]) == 2 and min(times["sleepy"]) >= 0.05
        assert times["local"] == [0.01, 0.01] and len(calls) == 4  # twice a round, the second counted
    finally:
        served.close()
    assert served.process.returncode == 0
    with pytest.raises(RuntimeError, match="exited with 1: ModuleNotFoundError: No module named 'no_such_runtime'"):
        Served([sys.executable, "-c", "import no_such_runtime"])
