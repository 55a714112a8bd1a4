"""Concurrent micro-batches in model.fit: the same training as one XLA step, state handled, bad use refused."""

import numpy as np
import pytest

import keras
import vit_keras
from vit_keras.training import train
from vit_keras.inference.predict import split_sizes
from vit_keras.training.microbatch import _reseed, enable_micro_batches

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, num_classes=5,
            include_preprocessing=False)  # fed normalized (standard normal) images


def data(n=14, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    return x, keras.utils.to_categorical(rng.integers(0, 5, n), 5)


def fitted(micro_batches, precision="float32", n=14, epochs=2, **kwargs):
    train.set_precision(precision)
    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", **{**TINY, **kwargs})
    train.compile_model(model, 1e-3, precision, jit_compile=micro_batches == 0, steps_per_execution=2)
    if micro_batches:
        enable_micro_batches(model, micro_batches)
    x, y = data(n)
    history = model.fit(x, y, batch_size=6, epochs=epochs, verbose=0, shuffle=False)  # batches of 6, 6, 2
    return model, history.history, model.evaluate(x, y, batch_size=6, verbose=0)


def test_split_sizes_cover_the_batch():
    assert split_sizes(6, 4) == [2, 2, 1, 1]
    assert split_sizes(2, 3) == [1, 1, 0]


def test_micro_batches_train_like_one_xla_step():
    reference, history, evaluation = fitted(0)
    model, micro_history, micro_evaluation = fitted(4)  # uneven parts of 6, and empty ones in the final batch of 2
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(history["loss"], micro_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(evaluation, micro_evaluation, rtol=1e-5)


def test_batch_norm_moving_mean_follows_the_whole_batch():
    keras.utils.set_random_seed(0)
    model = train.build_model_to_train(5, 1, (28, 28))  # the quick recipe's conv stem has BatchNorm
    train.compile_model(model, 0.0, jit_compile=False)
    enable_micro_batches(model, 2)
    x = np.random.default_rng(1).uniform(0, 255, (8, 28, 28, 1)).astype("float32")
    y = keras.utils.to_categorical(np.arange(8) % 5, 5)
    norm = model.get_layer("stem").blocks[0][1]
    stem_in = model.get_layer("preprocessing")(x)
    features = keras.ops.convert_to_numpy(model.get_layer("stem").blocks[0][0](stem_in))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # learning rate 0: one BN update, on the whole batch of 8
    expected = (1 - norm.momentum) * features.mean(axis=(0, 1, 2))  # from a zero moving mean
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_mean), expected, rtol=1e-4, atol=1e-6)


def test_micro_batches_draw_their_own_dropout_masks():
    model = vit_keras.create_model("vit_ti16", drop_path=0.2, **{**TINY, "num_layers": 2})  # rate > 0 in block 1
    state = [v.value for v in model.non_trainable_variables]
    seeds = [v.path.endswith("seed_generator_state") for v in model.non_trainable_variables]
    assert any(seeds)
    moved = _reseed(model, state, 1)
    for is_seed, before, after in zip(seeds, state, moved):
        assert np.array_equal(keras.ops.convert_to_numpy(before), keras.ops.convert_to_numpy(after)) != is_seed


def test_patch_dropout_trains_in_micro_batches_each_with_its_own_tokens():
    """PatchDropout's seed generator is one of the model's, so each micro-batch keeps its own patches, and the
    micro-batched step (the CLI's default under TensorFlow) trains through the shorter sequence."""
    model, history, (loss, _) = fitted(2, patch_dropout=0.5, epochs=1)
    assert np.isfinite(history["loss"][0]) and np.isfinite(loss)
    layer = model.patch_dropout_layer
    state = layer.seed_generator.state
    assert state.path.endswith("seed_generator_state") and any(v is state for v in model.non_trainable_variables)
def test_mixed_float16_scales_the_micro_batch_loss():
    try:
        model, history, _ = fitted(2, precision="mixed_float16", n=12, epochs=1)
    finally:
        train.set_precision("float32")
    assert np.all(np.isfinite(history["loss"]))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_bad_use_is_refused(tmp_path):
    model = vit_keras.create_model("vit_ti16", **TINY)
    with pytest.raises(ValueError, match="`micro_batches` must be a positive int"):
        enable_micro_batches(model, 0)
    train.compile_model(model, 1e-3, jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        enable_micro_batches(model, 2)
    with pytest.raises(ValueError, match="`micro_batches` must be a positive int"):
        train.train("fashion_mnist", str(tmp_path), limit=64, micro_batches=0, verbose=0)
