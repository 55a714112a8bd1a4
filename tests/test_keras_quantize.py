"""Keras's own quantization on our models: model.quantize, then save, reload in safe mode, model.export to LiteRT."""

import os

import numpy as np
import pytest

import vit_keras  # noqa: F401  (registers the layers before keras loads a model)
import keras

from app_models import train_fashion_run

# (mode, least top-1 agreement with the float model, largest logit error as a fraction of the largest logit) on
# the tiny Fashion-MNIST ViT, 300 test images: int8 keeps 8 bits a weight and activation (measured: 99%, 2%),
# float8 (e4m3) 3 mantissa bits (95%, 13%), int4 4 bits a weight (92%, 24%). This model is 62% accurate after two
# epochs, so many of its decisions are near-ties that any rounding flips.
MODES = (("int8", 0.97, 0.05), ("int4", 0.85, 0.35), ("float8", 0.90, 0.2))
TINY = dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, num_classes=5)


@pytest.fixture(scope="module")
def run(tmp_path_factory, fashion_train, fashion_test):
    """The tiny Fashion-MNIST ViT fitted for two epochs on 3000 images, and 300 test images (float32)."""
    (images, labels), (test, _) = fashion_train, fashion_test
    folder = tmp_path_factory.mktemp("keras_quantize")
    train_fashion_run(folder, images[:3000], labels[:3000], batch_size=100, epochs=2)
    return folder / "model.keras", test[:300].astype("float32")


def litert_scores(path, images):
    """The outputs of a Keras-exported .tflite (float input, batch 1) for ``images``, run by LiteRT."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    first_input, first_output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    outputs = []
    for image in images:
        interpreter.set_tensor(first_input["index"], image[None])
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(first_output["index"])[0].copy())
    return np.stack(outputs)


def test_a_new_model_quantizes_before_any_call():
    """DropPath is built with its block (Keras refused to quantize an unbuilt layer), with or without a rate."""
    for drop_path in (0.0, 0.1):
        model = vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, drop_path=drop_path, **TINY)
        model.quantize("int8")
        assert all(layer.built for layer in model._flatten_layers())
        assert model.get_layer("encoderblock_0").attn.qkv.quantization_mode == "int8"


@pytest.mark.parametrize("mode, least_agreement, error", MODES)
def test_a_quantized_model_predicts_saves_reloads_and_exports(run, tmp_path, mode, least_agreement, error):
    """Within the mode's expected error of the float model; reloaded in safe mode with the same outputs; exported
    by model.export to LiteRT with builtin ops alone, and that file gives the quantized model's decisions."""
    from vit_keras.convert.tflite import unsupported_ops

    path, images = run
    model = keras.saving.load_model(path)
    reference = model.predict(images, verbose=0)
    model.quantize(mode)
    logits = model.predict(images, verbose=0)
    assert np.mean(logits.argmax(-1) == reference.argmax(-1)) >= least_agreement
    assert np.abs(logits - reference).max() <= error * np.abs(reference).max()
    model.save(tmp_path / "quantized.keras")
    reloaded = keras.saving.load_model(tmp_path / "quantized.keras", safe_mode=True)
    np.testing.assert_allclose(reloaded.predict(images, verbose=0), logits, atol=1e-5)
    reloaded.export(str(tmp_path / "quantized.tflite"), format="litert", verbose=False)
    assert not unsupported_ops((tmp_path / "quantized.tflite").read_bytes())  # no Flex or custom ops
    scores = litert_scores(tmp_path / "quantized.tflite", images[:100])
    # int8: TFLite's dynamic-range kernels round activations per row, Keras's per token; float8: the file
    # computes in float32, as the float model does.
    assert np.mean(scores.argmax(-1) == logits[:100].argmax(-1)) >= least_agreement


def test_model_export_of_int8_keeps_int8_weights(run, tmp_path):
    """The int8 model's .tflite holds its dense layers' weights in int8 (FULLY_CONNECTED computes in integers), the
    float model's in float."""
    from vit_keras.convert.runtime import op_precisions

    path, _ = run
    model = keras.saving.load_model(path)
    model.export(str(tmp_path / "float.tflite"), format="litert", verbose=False)
    model.quantize("int8")
    model.export(str(tmp_path / "int8.tflite"), format="litert", verbose=False)
    assert "FULLY_CONNECTED" in op_precisions(str(tmp_path / "int8.tflite"))[1]
    assert "FULLY_CONNECTED" not in op_precisions(str(tmp_path / "float.tflite"))[1]
    assert os.path.getsize(tmp_path / "int8.tflite") < os.path.getsize(tmp_path / "float.tflite")


def named_tiny(name):
    """``name`` at its own patch size (and stem), four patches a side, with a tiny encoder."""
    from vit_keras.models.configs import MODELS

    _, patch, stem = MODELS[name]
    return vit_keras.create_model(name, image_size=2 * patch if stem else 4 * min(patch, 8),
                                  **{**TINY, "patch_size": patch if stem else min(patch, 8)})


@pytest.mark.parametrize("name", vit_keras.list_models())
def test_every_named_model_quantizes_saves_and_reloads(name, tmp_path):
    keras.utils.set_random_seed(0)
    model = named_tiny(name)
    model.quantize("int8")
    images = np.random.default_rng(0).normal(size=(2, *model.input_shape[1:])).astype("float32")
    logits = keras.ops.convert_to_numpy(model(images))  # eager: no predict function to trace
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(images)), logits, atol=1e-5)
    keras.backend.clear_session()


def full_collections(action):
    """How many full (generation-2) garbage collections ``action()`` ran over the whole heap: with no object
    frozen (a collection while the older objects are frozen walks only the new ones)."""
    import gc

    started = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2 and not gc.get_freeze_count():
            started.append(1)

    gc.callbacks.append(count)
    try:
        action()
    finally:
        gc.callbacks.remove(count)
    return len(started)


def test_quantize_and_reload_run_one_garbage_collection_not_one_a_layer(tmp_path):
    """Keras collects garbage after each variable a layer deletes: a pass over the whole heap for every Dense
    layer quantize touches. Ours walk the heap once, and leave the collector as they found it, a process's own
    frozen objects included."""
    import gc

    model = vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, **{**TINY, "num_layers": 4})
    dense = sum(isinstance(layer, keras.layers.Dense) for layer in model._flatten_layers())
    assert dense == 17
    # ours is one; a second may be Python's own, when the objects a call leaves pass its threshold
    assert full_collections(lambda: model.quantize("int8")) <= 2 and gc.get_freeze_count() == 0
    model.save(tmp_path / "model.keras")
    assert full_collections(lambda: vit_keras.load_model(tmp_path / "model.keras")) <= 2
    gc.freeze()  # a process that froze its own objects (a pre-fork server) keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, **TINY).quantize("int8")
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    keras.backend.clear_session()


def test_the_quick_recipe_model_quantizes_and_exports(tmp_path):
    """scripts/main.sh's model (conv stem, GAP, no class token) through quantize, save, reload and export."""
    from vit_keras.training.train import build_model_to_train

    model = build_model_to_train(10, 1, (28, 28))
    model.quantize("int8")
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 1)).astype("float32")
    logits = keras.ops.convert_to_numpy(model(images))
    model.save(tmp_path / "quick.keras")
    reloaded = keras.saving.load_model(tmp_path / "quick.keras", safe_mode=True)
    reloaded.export(str(tmp_path / "quick.tflite"), format="litert", verbose=False)
    scores = litert_scores(tmp_path / "quick.tflite", images)
    assert scores.shape == logits.shape and np.all(scores.argmax(-1) == logits.argmax(-1))


def test_vit_keras_export_refuses_a_keras_quantized_model(tmp_path):
    from vit_keras.convert.export import export_tflite

    model = vit_keras.create_model("vit_ti16", image_size=32, patch_size=8, **TINY)
    model.quantize("int8")
    with pytest.raises(ValueError, match="quantized by Keras's model.quantize; export the float model"):
        export_tflite(model, tmp_path / "model.tflite", labels=[str(i) for i in range(5)], quantize="float32")
