"""Models: the paper's configs, reference parameter counts, serialization, bad configs, a real fit."""

import numpy as np
import pytest

import keras
import vit_keras
from keras import ops

# timm 1.0.31, num_classes=1000; printed by scripts/reference_param_counts.py.
REFERENCE_PARAMS = {
    "vit_ti16": 5717416,  # timm vit_tiny_patch16_224
    "vit_s16": 22050664,  # timm vit_small_patch16_224
    "vit_s32": 22878952,  # timm vit_small_patch32_224
    "vit_b8": 86576872,  # timm vit_base_patch8_224
    "vit_b16": 86567656,  # timm vit_base_patch16_224
    "vit_b32": 88224232,  # timm vit_base_patch32_224
    "vit_l16": 304326632,  # timm vit_large_patch16_224
    "vit_l32": 306535400,  # timm vit_large_patch32_224
    "vit_h14": 632045800,  # timm vit_huge_patch14_224
    "vit_r26_s32": 36431912,  # timm vit_small_r26_s32_224
    "vit_r50_b16": 98659112,  # timm vit_base_r50_s16_224
    "vit_r50_l32": 328994856,  # timm vit_large_r50_s32_224
}

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, num_classes=5,
            include_preprocessing=False)  # the architecture's tests feed it normalized images


def tiny(**kwargs):
    return vit_keras.create_model("vit_ti16", **{**TINY, **kwargs})


def test_every_model_has_a_reference_count():
    assert sorted(REFERENCE_PARAMS) == vit_keras.list_models()


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMS))
def test_parameter_count_equals_reference(name):
    model = vit_keras.create_model(name)
    assert model.count_params() == REFERENCE_PARAMS[name]
    keras.backend.clear_session()


def test_convenience_functions_match_create_model():
    model = vit_keras.create_model("vit_s16", image_size=32, num_classes=7, num_layers=1)
    assert model.output_shape == (None, 7)
    assert model.get_config()["hidden_size"] == 384 and model.get_config()["patch_size"] == 16


@pytest.mark.parametrize("kwargs, output", [
    (dict(), (None, 5)),
    (dict(image_size=(32, 48)), (None, 5)),
    (dict(pooling="gap"), (None, 5)),
    (dict(pooling="sequence"), (None, 5)),
    (dict(include_top=False), (None, 32)),
    (dict(representation_size=16), (None, 5)),
    (dict(stem="conv", patch_size=4, channels=1), (None, 5)),
    (dict(position_embedding="sincos_2d", channels=1, include_preprocessing=True), (None, 5)),
])
def test_shapes(kwargs, output):
    model = tiny(**kwargs)
    images = np.random.default_rng(0).uniform(size=(2, *model.input_shape[1:])).astype("float32")
    images = images * 255 if model.takes_raw_pixels else images
    assert model.output_shape == output
    assert model.predict(images, verbose=0).shape == (2, *output[1:])


def test_gap_pooling_has_no_class_token():
    model = tiny(pooling="gap")
    assert model.get_layer("embedding").num_tokens == 16
    assert not hasattr(model.get_layer("embedding"), "cls")


def test_hybrid_stem_takes_1x1_patches_of_the_feature_map():
    model = vit_keras.create_model("vit_r26_s32", image_size=64, num_classes=3, num_layers=1)
    embedding = model.get_layer("embedding")
    assert embedding.patch_size == (1, 1) and embedding.grid_size == (2, 2)
    assert model.get_layer("stem").output_channels == 2048
    assert model.predict(np.zeros((1, 64, 64, 3), "float32"), verbose=0).shape == (1, 3)


@pytest.mark.parametrize("pooling,readout", [("token", 1), ("gap", None)])
def test_last_block_reads_out_the_class_token_alone_with_the_same_logits(pooling, readout):
    model = tiny(pooling=pooling, num_layers=3)
    assert [block.query_tokens for block in model.blocks] == [None, None, readout]
    images = np.random.default_rng(4).normal(size=(2, 32, 32, 3)).astype("float32")
    x = ops.convert_to_tensor(images)
    for layer in model.layers[1:]:  # the same weights, every block over all tokens
        x = layer.attn(layer.norm1(x)) + x if isinstance(layer, vit_keras.TransformerBlock) else layer(x)
        if isinstance(layer, vit_keras.TransformerBlock):
            x = x + layer.mlp(layer.norm2(x))
    np.testing.assert_allclose(model.predict(images, verbose=0), ops.convert_to_numpy(x), atol=1e-4)


def test_attention_maps_for_every_layer():
    model = tiny()
    images = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype("float32")
    maps = model.attention_maps(images, batch_size=2)
    assert len(maps) == 2
    for weights in maps:
        assert weights.shape == (3, 2, 17, 17)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("batch,micro_batches", [(5, 4), (1, 4), (6, 2), (3, 1)])
def test_micro_batched_inference_equals_the_model(batch, micro_batches):
    import tensorflow as tf

    model = tiny(stem="conv", patch_size=4)  # BatchNorm in the stem: inference statistics, per example
    images = np.random.default_rng(0).normal(size=(batch, 32, 32, 3)).astype("float32")
    expected = np.asarray(model(images, training=False))
    forward = vit_keras.predict_function(model, micro_batches=micro_batches)
    np.testing.assert_allclose(np.asarray(forward(tf.constant(images))), expected, atol=1e-5)
    labels = np.zeros(batch, "int64")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(2)
    np.testing.assert_allclose(vit_keras.predict(model, dataset, micro_batches=micro_batches), expected, atol=1e-5)
    np.testing.assert_allclose(vit_keras.predict(model, images, batch_size=4, jit_compile=False), expected, atol=1e-5)


def test_predict_reuses_its_compiled_function_across_calls():
    """A second ``predict`` of the same batch size neither retraces nor recompiles (it had, every call); the model
    held weakly, so a dropped model frees its functions."""
    import gc
    import weakref

    import tensorflow as tf

    from vit_keras.inference.predict import COMPILED

    model = tiny()
    images = np.random.default_rng(0).uniform(-1, 1, (32, 32, 32, 3)).astype("float32")
    first = vit_keras.predict(model, images[:16], batch_size=16)
    run = vit_keras.predict_function(model)
    traces = run.experimental_get_tracing_count()
    second = vit_keras.predict(model, images[16:], batch_size=16)
    assert run.experimental_get_tracing_count() == traces
    assert vit_keras.predict_function(model) is run
    assert vit_keras.predict_function(model, micro_batches=2) is not run
    np.testing.assert_allclose(np.concatenate([first, second]), model(images, training=False), atol=1e-4)
    alive = weakref.ref(model)
    assert alive() in COMPILED
    del model, run
    gc.collect()
    assert alive() is None  # its compiled functions kept no reference to it
    with tf.device("/cpu:0"):  # and a fresh model gets its own function
        assert vit_keras.predict(tiny(), images[:2]).shape == (2, TINY["num_classes"])


def test_micro_batched_inference_rejects_bad_arguments():
    with pytest.raises(ValueError, match="micro_batches"):
        vit_keras.predict_function(tiny(), micro_batches=0)
    with pytest.raises(ValueError, match="empty"):
        vit_keras.predict(tiny(), np.zeros((0, 32, 32, 3), "float32"))
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        vit_keras.predict(tiny(), np.zeros((2, 32, 32, 3), "float32"), batch_size=0)


def test_save_load_round_trip_safe_mode(tmp_path):
    model = tiny(pooling="sequence", position_embedding="learned_2d", drop_path=0.1, stem="conv", patch_size=4,
                 include_preprocessing=True)
    images = np.random.default_rng(0).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    expected = model.predict(images, verbose=0)
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path, safe_mode=True)
    assert isinstance(restored, vit_keras.VisionTransformer)
    assert restored.get_config() == model.get_config()
    np.testing.assert_array_equal(restored.predict(images, verbose=0), expected)


def test_hybrid_save_load_round_trip(tmp_path):
    model = vit_keras.create_model("vit_r26_s32", image_size=32, num_classes=3, num_layers=1, hidden_size=32,
                                   num_heads=2, mlp_dim=32, include_preprocessing=False)
    images = np.random.default_rng(0).normal(size=(1, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "h.keras")
    restored = keras.models.load_model(tmp_path / "h.keras")
    np.testing.assert_array_equal(restored.predict(images, verbose=0), model.predict(images, verbose=0))


def test_resize_position_embedding_identity_and_smooth():
    rng = np.random.default_rng(0)
    pos = rng.normal(size=(1, 1 + 16, 8)).astype("float32")
    np.testing.assert_allclose(vit_keras.resize_position_embedding(pos, (4, 4)), pos, atol=1e-6)
    # a smooth field stays smooth: bicubic reproduces a linear ramp inside the grid
    ramp = np.linspace(-1, 1, 4)
    field = (ramp[:, None, None] + 2 * ramp[None, :, None]) * np.ones((1, 1, 8))
    pos = np.concatenate([rng.normal(size=(1, 1, 8)), field.reshape(1, 16, 8)], axis=1).astype("float32")
    big = vit_keras.resize_position_embedding(pos, (8, 6))
    assert big.shape == (1, 1 + 48, 8)
    np.testing.assert_array_equal(big[:, 0], pos[:, 0])  # the class-token row is kept
    grid = big[0, 1:, 0].reshape(8, 6)
    assert np.all(np.diff(grid[2:-2, 1:-1], axis=0) > 0) and np.all(np.diff(grid[2:-2, 1:-1], axis=1) > 0)
    assert np.abs(np.diff(grid, axis=0)).max() < 0.6


def test_resize_model_keeps_predictions_at_the_same_size_and_runs_at_a_new_one():
    model = tiny(image_size=(32, 32))
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    same = vit_keras.resize_model(model, 32)
    np.testing.assert_allclose(same.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-5)
    bigger = vit_keras.resize_model(model, (48, 64))
    assert bigger.get_layer("embedding").pos_embedding.shape == (1, 1 + 6 * 8, 32)
    assert bigger.predict(np.zeros((1, 48, 64, 3), "float32"), verbose=0).shape == (1, 5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(image_size=30), r"`image_size`=\(30, 30\) is not divisible by `patch_size`"),
    (dict(hidden_size=30, num_heads=4), r"`hidden_size`=30 must be divisible by `num_heads`=4"),
    (dict(pooling="max"), r"Unknown `pooling`='max'; valid values are 'token', 'gap'"),
    (dict(position_embedding="rope"), r"Unknown `position_embedding`='rope'; valid values are 'learned'"),
    (dict(stem="vgg"), r"Unknown `stem`='vgg'"),
    (dict(stem="conv", patch_size=6, image_size=36), r"`stem`='conv' needs a power-of-two `patch_size`"),
    (dict(num_layers=0), r"`num_layers` must be a positive int"),
    (dict(num_heads=0), r"`num_heads` must be a positive int"),
    (dict(stem="conv", patch_size=(8, 4)), r"`patch_size` must be square"),
    (dict(stem="r26", patch_size=16, image_size=64), r"'r26' downsamples by 32 .* `patch_size` must be 32"),
    (dict(stem="r26", patch_size=32, image_size=48), r"not divisible by the 'r26' stem's stride 32"),
    (dict(dropout=1.0), r"`dropout` is a rate: it must be in \[0, 1\); got 1.0"),
    (dict(attention_dropout=-0.1), r"`attention_dropout` is a rate"),
    (dict(drop_path=5.0), r"`drop_path` is a rate"),
    (dict(norm_epsilon=-1), r"`norm_epsilon` must be > 0"),
])
def test_invalid_configs_raise_at_build_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_unknown_model_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown model name 'vit_z16'; valid names are .*vit_b16"):
        vit_keras.create_model("vit_z16")


def test_wrong_channel_count_at_call_time():
    model = tiny()
    with pytest.raises(ValueError, match=r"takes images with `channels`=3"):
        model.predict(np.zeros((1, 32, 32, 1), "float32"), verbose=0)


def test_fit_on_real_fashion_mnist_lowers_the_loss():
    from vit_keras.data.datasets import load_arrays

    images, labels, names = load_arrays("fashion_mnist", split="train", limit=1024)
    assert images.shape == (1024, 28, 28, 1) and len(names) == 10
    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", image_size=28, channels=1, patch_size=7, hidden_size=32,
                                   num_heads=2, mlp_dim=64, num_layers=1, num_classes=10,
                                   include_preprocessing=True)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.evaluate(images, labels, verbose=0)
    model.fit(images, labels, batch_size=64, epochs=2, verbose=0)
    after = model.evaluate(images, labels, verbose=0)
    assert after < 0.8 * before, (before, after)


def test_mixed_precision_keeps_logits_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = tiny()
        logits = model(np.zeros((1, 32, 32, 3), "float32"))
        assert ops.dtype(logits) == "float32"
        assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_model_code_imports_no_tensorflow():
    """vit_keras/models/ uses keras.ops only (ARCHITECTURE.md), so it runs on Keras's other backends:
    benchmarks/gpu_check.py runs it under JAX on a GPU machine with no TensorFlow."""
    import ast
    import pathlib

    folder = pathlib.Path(vit_keras.__file__).parent / "models"
    allowed = ("vit_keras.models", "vit_keras.constants", "vit_keras.validation", "vit_keras.framework")
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level: what importing the module pulls in
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "tensorflow" for a in node.names), path.name
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert module.split(".")[0] != "tensorflow", path.name
                if module == "vit_keras":  # ``from vit_keras import framework``
                    assert {a.name for a in node.names} <= {"framework"}, (path.name, module)
                elif module.startswith("vit_keras"):  # the project's own modules must be backend-neutral too
                    assert module.startswith(allowed), (path.name, module)


def test_bare_import_loads_no_keras_or_tensorflow():
    """`import vit_keras` is light (PEP 562): the names load their modules on first use."""
    import subprocess
    import sys

    code = ("import sys, vit_keras; heavy = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')]; "
            "assert not heavy, heavy; assert 'create_model' in dir(vit_keras); vit_keras.create_model; "
            "assert 'keras' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize("build, where, typo, nearest", [
    (lambda **kw: tiny(**kw), "create_model", "patch_szie", "patch_size"),
    (lambda **kw: tiny(**kw), "create_model", "weigths", "weights"),
    (lambda **kw: vit_keras.VisionTransformer(**{**TINY, **kw}), "VisionTransformer", "hidden_szie", "hidden_size"),
    (lambda **kw: vit_keras.model_config("vit_ti16", **kw), "model_config", "num_layer", "num_layers"),
])
def test_unknown_keyword_is_refused_naming_the_nearest(build, where, typo, nearest):
    with pytest.raises(TypeError, match=rf"{where} got unknown keyword argument '{typo}' \(did you mean '{nearest}'\?\)"):
        build(**{typo: 8})


def test_unknown_keyword_without_a_near_name_lists_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown keyword argument 'bogus_option'; valid keywords are .*patch_size"):
        vit_keras.create_model("vit_ti16", bogus_option=5)


def test_parts_are_named_once_as_properties():
    from vit_keras.models import layers
    from vit_keras.models import readout
    from vit_keras.models import stems

    model = tiny(stem="conv", patch_size=4, include_preprocessing=True, representation_size=16)
    assert isinstance(model.preprocessing, keras.layers.Rescaling)
    assert isinstance(model.stem, stems.ConvStem)
    assert isinstance(model.patch_encoder, layers.PatchEncoder) and model.patch_encoder.grid_size == model.grid_size
    assert [block.name for block in model.blocks] == ["encoderblock_0", "encoderblock_1"]
    assert model.encoder_norm is model.get_layer("encoder_norm")
    assert isinstance(model.pooling_layer, readout.TokenPooling)
    assert model.pre_logits.units == 16 and model.head.units == 5
    plain = tiny(include_top=False)
    assert plain.preprocessing is plain.stem is plain.pre_logits is plain.head is None


def test_rebuild_with_new_classes_keeps_every_other_weight_and_zeroes_the_head():
    model = tiny(representation_size=16)
    model.head.set_weights([np.ones(w.shape, "float32") for w in model.head.get_weights()])
    fresh = model.rebuild(num_classes=7)
    assert fresh.output_shape == (None, 7)
    assert all(not np.any(w) for w in fresh.head.get_weights())
    for source, target in zip(model.layers, fresh.layers):
        if target is not fresh.head:
            assert all(np.array_equal(a, b) for a, b in zip(source.get_weights(), target.get_weights())), target.name
    images = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    same = model.rebuild(drop_path=0.1)  # the head fits: copied, and the model computes the same
    assert same.get_config()["drop_path"] == 0.1
    np.testing.assert_array_equal(same.predict(images, verbose=0), model.predict(images, verbose=0))
    with pytest.raises(TypeError, match=r"'num_clases' \(did you mean 'num_classes'\?\)"):
        model.rebuild(num_clases=3)


@pytest.mark.parametrize("position_embedding", ["learned_2d", "sincos_2d"])
def test_rebuild_at_another_size_refits_every_position_table(position_embedding):
    from vit_keras.models import position

    model = tiny(position_embedding=position_embedding, pooling="gap")
    bigger = vit_keras.resize_model(model, (48, 64))
    old, new = model.patch_encoder, bigger.patch_encoder
    assert new.grid_size == (6, 8)
    if position_embedding == "sincos_2d":  # fixed: the new grid's own table
        np.testing.assert_array_equal(ops.convert_to_numpy(new.pos_embedding)[0],
                                      vit_keras.models.layers.sincos_2d_embedding((6, 8), 32))
    else:
        for name, axis in (("pos_row", 0), ("pos_col", 1)):
            want = position.resize_axis_embedding(ops.convert_to_numpy(getattr(old, name)), new.grid_size[axis])
            np.testing.assert_allclose(ops.convert_to_numpy(getattr(new, name)), want, atol=1e-6)
    np.testing.assert_array_equal(ops.convert_to_numpy(new.kernel), ops.convert_to_numpy(old.kernel))


def test_old_import_paths_of_the_position_helpers():
    from vit_keras import models
    from vit_keras.models import position

    assert vit_keras.resize_position_embedding is position.resize_position_embedding
    assert models.resize_position_embedding is position.resize_position_embedding
    np.testing.assert_array_equal(position.resample_matrix(5, 5), np.eye(5))


# ---- input normalization (pixel_mean / pixel_std) ----------------------------------------------------------

CIFAR = dict(pixel_mean=(0.4914, 0.4822, 0.4465), pixel_std=(0.247, 0.2435, 0.2616))  # a per-channel normalization


def test_default_normalization_is_the_rescaling_of_before():
    """None (and 0.5 on every channel) builds exactly the layer of earlier versions: Rescaling(1 / 127.5, -1)."""
    before = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="preprocessing").get_config()
    for kwargs in (dict(), dict(pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3), dict(pixel_mean="inception"),
                   dict(channels=1), dict(channels=1, pixel_mean=(0.5,), pixel_std=(0.5,))):
        model = tiny(include_preprocessing=True, **kwargs)
        assert isinstance(model.preprocessing, keras.layers.Rescaling)
        assert model.preprocessing.get_config() == before, kwargs
    assert tiny().get_config()["pixel_mean"] is None and tiny().get_config()["pixel_std"] is None


def test_per_channel_normalization_equals_normalizing_by_hand():
    keras.utils.set_random_seed(0)
    model = tiny(include_preprocessing=True, **CIFAR)
    plain = tiny(include_preprocessing=False, **CIFAR)
    plain.set_weights(model.get_weights())  # the Rescaling has no weights: the same list
    pixels = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    by_hand = (pixels / 255.0 - np.array(CIFAR["pixel_mean"])) / np.array(CIFAR["pixel_std"])
    np.testing.assert_allclose(ops.convert_to_numpy(model.preprocessing(pixels)), by_hand, atol=1e-5)
    np.testing.assert_allclose(model.predict(pixels, verbose=0), plain.predict(by_hand.astype("float32"), verbose=0),
                               atol=1e-4)
    default = tiny(include_preprocessing=True)
    default.set_weights(model.get_weights())  # the normalization is what changes the logits
    assert np.abs(default.predict(pixels, verbose=0) - model.predict(pixels, verbose=0)).max() > 1e-2
    # model_inputs (explain, inspect, the web app's overlay) normalizes for the model without the layer
    np.testing.assert_allclose(vit_keras.visualize.model_inputs(plain, pixels), by_hand, atol=1e-5)
    np.testing.assert_array_equal(vit_keras.visualize.model_inputs(model, pixels), pixels)


def test_per_channel_normalization_saves_loads_and_survives_rebuild(tmp_path):
    model = tiny(include_preprocessing=True, **CIFAR)
    pixels = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "m.keras")
    restored = vit_keras.load_model(tmp_path / "m.keras")
    assert restored.get_config()["pixel_mean"] == list(CIFAR["pixel_mean"])
    assert restored.get_config() == model.get_config()
    np.testing.assert_array_equal(restored.predict(pixels, verbose=0), model.predict(pixels, verbose=0))
    for changed in (vit_keras.resize_model(model, 48), model.rebuild(num_classes=3), model.rebuild(drop_path=0.1)):
        assert changed.preprocessing.get_config() == model.preprocessing.get_config()
        assert (changed.vit_config["pixel_mean"], changed.vit_config["pixel_std"]) == \
            (list(CIFAR["pixel_mean"]), list(CIFAR["pixel_std"]))
    np.testing.assert_allclose(model.rebuild(drop_path=0.1).predict(pixels, verbose=0),
                               model.predict(pixels, verbose=0), atol=1e-6)


def test_a_file_saved_before_the_normalization_options_loads_with_the_same_outputs(tmp_path):
    """A .keras file whose config has no pixel_mean / pixel_std (saved by an earlier version) loads as before."""
    import json
    import zipfile

    model = tiny(include_preprocessing=True)
    model.save(tmp_path / "new.keras")
    old = tmp_path / "old.keras"
    with zipfile.ZipFile(tmp_path / "new.keras") as source, zipfile.ZipFile(old, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                for key in ("pixel_mean", "pixel_std"):
                    del config["config"][key]
                data = json.dumps(config).encode()
            target.writestr(item, data)
    restored = vit_keras.load_model(old)
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(restored.predict(pixels, verbose=0), model.predict(pixels, verbose=0))
    assert restored.preprocessing.get_config() == model.preprocessing.get_config()


@pytest.mark.parametrize("kwargs, message", [
    (dict(pixel_mean=(0.5, 0.5)), r"`pixel_mean` has 2 value\(s\) but the model has `channels`=3"),
    (dict(channels=1, pixel_std=(0.2, 0.2, 0.2)), r"`pixel_std` has 3 value\(s\) but the model has `channels`=1"),
    (dict(pixel_std=(0.2, 0.0, 0.2)), r"`pixel_std` values must be in \(0, 1\]: a std must be > 0"),
    (dict(pixel_std=(0.2, -0.1, 0.2)), r"`pixel_std` values must be in \(0, 1\]"),
    (dict(pixel_mean=(123.7, 116.3, 103.5)), r"`pixel_mean` values must be in \[0, 1\].*divide by 255"),
    (dict(pixel_mean=(-0.1, 0.5, 0.5)), r"`pixel_mean` values must be in \[0, 1\]"),
    (dict(pixel_std=(1.5, 0.5, 0.5)), r"`pixel_std` values must be in \(0, 1\]"),
    (dict(pixel_mean=(float("nan"), 0.5, 0.5)), r"`pixel_mean` must be 3 value\(s\) in \[0, 1\]"),
    (dict(pixel_mean=0.5), r"`pixel_mean` must be 3 value\(s\) in \[0, 1\]"),
    (dict(pixel_mean="imagnet"), r"Unknown `pixel_mean`='imagnet'; valid presets are 'checkpoint', 'inception'"),
    (dict(pixel_mean="imagenet", pixel_std=(0.5,) * 3), r"`pixel_mean`='imagenet' sets both"),
    (dict(channels=1, pixel_mean="imagenet"), r"`pixel_mean`='imagenet' has 3 value\(s\) but the model has "
                                               r"`channels`=1"),
    (dict(pixel_mean="checkpoint"), r"`pixel_mean`='checkpoint' reads the normalization from `weights`"),
])
def test_bad_normalization_is_refused_naming_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)
    if "checkpoint" not in kwargs.values():  # VisionTransformer itself checks them too
        with pytest.raises(ValueError, match=message):
            vit_keras.VisionTransformer(**{**TINY, **kwargs})


def test_presets_give_their_values():
    model = tiny(pixel_mean="imagenet", include_preprocessing=True)
    assert model.vit_config["pixel_mean"] == [0.485, 0.456, 0.406]
    assert model.vit_config["pixel_std"] == [0.229, 0.224, 0.225]
    assert tiny(channels=1, pixel_std="inception").vit_config["pixel_mean"] == [0.5]


# A checkpoint's own normalization: a Hugging Face folder's preprocessor_config.json, a timm folder's config.json.
WEIGHTS = "tests/fixtures/weights"
HF_TINY = dict(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2, num_classes=10)
TIMM_TINY = dict(image_size=48, patch_size=16, hidden_size=64, num_heads=2, mlp_dim=128, num_layers=2,
                 num_classes=6)


def checkpoint_folder(folder, fixture, sidecar, content):
    import json
    import os
    import shutil

    folder.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shutil.copy(os.path.join(root, WEIGHTS, fixture), folder / "model.safetensors")
    (folder / sidecar).write_text(json.dumps(content))
    return folder


def test_checkpoint_normalization_from_a_hugging_face_or_timm_folder(tmp_path):
    from vit_keras.weights.loader import checkpoint_normalization

    hf = checkpoint_folder(tmp_path / "hf", "hf_vit_classifier.safetensors", "preprocessor_config.json",
                           {"do_normalize": True, "do_rescale": True, "rescale_factor": 1 / 255,
                            "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]})
    timm = checkpoint_folder(tmp_path / "timm", "timm_vit.safetensors", "config.json",
                             {"architecture": "vit_tiny", "pretrained_cfg": {"mean": [0.5, 0.4, 0.3],
                                                                             "std": [0.2, 0.3, 0.4]}})
    assert checkpoint_normalization(hf) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    assert checkpoint_normalization(hf / "model.safetensors") == checkpoint_normalization(hf)
    assert checkpoint_normalization(timm) == ([0.5, 0.4, 0.3], [0.2, 0.3, 0.4])
    model = vit_keras.create_model("vit_ti16", weights=hf, pixel_mean="checkpoint", include_preprocessing=True,
                                   norm_epsilon=1e-12, **HF_TINY)
    assert (model.vit_config["pixel_mean"], model.vit_config["pixel_std"]) == checkpoint_normalization(hf)
    from_file = vit_keras.create_model("vit_ti16", weights=hf / "model.safetensors", norm_epsilon=1e-12, **HF_TINY)
    for mine, theirs in zip(model.get_weights(), from_file.get_weights()):  # the folder's weights were loaded
        np.testing.assert_array_equal(mine, theirs)
    model = vit_keras.create_model("vit_ti16", weights=timm, pixel_mean="checkpoint", **TIMM_TINY)
    assert model.vit_config["pixel_std"] == [0.2, 0.3, 0.4]


def test_checkpoint_normalization_where_the_checkpoint_records_none(tmp_path):
    import os

    from vit_keras.weights.loader import checkpoint_normalization

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    npz = os.path.join(root, WEIGHTS, "google_augreg.npz")
    bare = checkpoint_folder(tmp_path / "bare", "timm_vit.safetensors", "README.md", {})
    assert checkpoint_normalization(npz) is None and checkpoint_normalization(bare / "model.safetensors") is None
    with pytest.raises(ValueError, match=r"records no input normalization .* pixel_mean='imagenet' for timm"):
        vit_keras.create_model("vit_ti16", weights=bare, pixel_mean="checkpoint", **TIMM_TINY)
    # a timm file without its folder: timm's ImageNet default when asked for by name
    model = vit_keras.create_model("vit_ti16", weights=bare / "model.safetensors", pixel_mean="imagenet", **TIMM_TINY)
    assert model.vit_config["pixel_mean"] == [0.485, 0.456, 0.406]
    odd = checkpoint_folder(tmp_path / "odd", "hf_vit_classifier.safetensors", "preprocessor_config.json",
                            {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "rescale_factor": 1.0})
    with pytest.raises(ValueError, match="does not rescale by 1/255"):
        checkpoint_normalization(odd)
    plain = checkpoint_folder(tmp_path / "plain", "hf_vit_classifier.safetensors", "preprocessor_config.json",
                              {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_normalize": False})
    assert checkpoint_normalization(plain) == ([0.0] * 3, [1.0] * 3)  # pixel / 255 alone
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        vit_keras.create_model("vit_ti16", weights=tmp_path, **TIMM_TINY)


def test_fine_tuning_a_saved_per_channel_model_keeps_its_normalization(tmp_path):
    from vit_keras.training.train import finetune_from

    model = tiny(include_preprocessing=True, **CIFAR)
    model.save(tmp_path / "m.keras")
    tuned = finetune_from(tmp_path / "m.keras", num_classes=3, image_size=48)
    assert tuned.vit_config["num_classes"] == 3 and tuned.vit_config["image_size"] == (48, 48)
    assert tuned.preprocessing.get_config() == model.preprocessing.get_config()
