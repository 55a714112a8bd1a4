"""The layers against the paper's equations."""

import numpy as np
import pytest

import vit_keras  # noqa: F401  (registers the layers)
import keras
from keras import ops
from vit_keras.models.encoder import MultiHeadSelfAttention, TransformerBlock
from vit_keras.models.layers import DropPath, PatchDropout, PatchEncoder, Patches, kept_patches
from vit_keras.models.readout import TokenPooling
from vit_keras.models.stems import ConvStem, ResNetV2Stem, StdConv2D


def test_patches_shape_and_order_rectangular():
    images = np.arange(2 * 8 * 12 * 3, dtype="float32").reshape(2, 8, 12, 3)
    patches = ops.convert_to_numpy(Patches(4)(images))
    assert patches.shape == (2, 2 * 3, 4 * 4 * 3)
    # patch (row 1, col 2) is the image block [4:8, 8:12], flattened (row, col, channel)
    np.testing.assert_array_equal(patches[1, 1 * 3 + 2], images[1, 4:8, 8:12].reshape(-1))


def test_patches_rejects_indivisible_size():
    with pytest.raises(ValueError, match="image_size.*not divisible by `patch_size`"):
        Patches(5)(np.zeros((1, 12, 12, 3), "float32"))


def test_patch_encoder_is_eq1_with_class_token_first_and_summed_position():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 8, 8, 3)).astype("float32")
    encoder = PatchEncoder(4, 16, grid_size=2)
    z0 = ops.convert_to_numpy(encoder(images))
    assert z0.shape == (2, 5, 16)
    kernel, bias, cls, pos = (ops.convert_to_numpy(w) for w in (encoder.kernel, encoder.bias, encoder.cls,
                                                                  encoder.pos_embedding))
    cls_value = rng.normal(size=cls.shape).astype("float32")
    encoder.cls.assign(cls_value)
    z0 = ops.convert_to_numpy(encoder(images))
    projected = ops.convert_to_numpy(Patches(4)(images)) @ kernel.reshape(-1, 16) + bias  # x_p E
    expected = np.concatenate([np.broadcast_to(cls_value, (2, 1, 16)), projected], axis=1) + pos
    np.testing.assert_allclose(z0, expected, atol=1e-5)
    assert pos.shape == (1, 5, 16)  # one E_pos row per token: a sum, not a concat


@pytest.mark.parametrize("kind", ["learned", "learned_2d", "sincos_2d", "none"])
def test_position_embedding_options(kind):
    encoder = PatchEncoder(2, 8, grid_size=(2, 3), position_embedding=kind)
    out = encoder(np.zeros((1, 4, 6, 1), "float32"))
    assert out.shape == (1, 7, 8)
    table = encoder.position_table()
    if kind == "none":
        assert table is None
        np.testing.assert_allclose(ops.convert_to_numpy(out)[0, 1:], np.broadcast_to(
            ops.convert_to_numpy(encoder.bias), (6, 8)), atol=1e-6)
        return
    table = ops.convert_to_numpy(table)
    assert table.shape == (1, 7, 8)
    if kind == "learned_2d":  # same row -> same first half; same column -> same second half
        grid = table[0, 1:].reshape(2, 3, 8)
        np.testing.assert_array_equal(grid[0, 0, :4], grid[0, 2, :4])
        np.testing.assert_array_equal(grid[0, 1, 4:], grid[1, 1, 4:])
    if kind == "sincos_2d":
        assert not encoder.pos_embedding.trainable
        np.testing.assert_array_equal(table[0, 0], 0)


def test_position_embedding_rejects_unknown():
    with pytest.raises(ValueError, match="position_embedding.*'learned', 'learned_2d', 'sincos_2d', 'none'"):
        PatchEncoder(2, 8, 2, position_embedding="relative")


def test_gap_encoder_without_class_token():
    encoder = PatchEncoder(2, 8, grid_size=2, class_token=False)
    assert encoder(np.zeros((3, 4, 4, 1), "float32")).shape == (3, 4, 8)
    pooled = TokenPooling("gap", class_token=False)(np.arange(24, dtype="float32").reshape(1, 3, 8))
    np.testing.assert_allclose(ops.convert_to_numpy(pooled), np.arange(24).reshape(3, 8).mean(0)[None])
    with pytest.raises(ValueError, match="pooling"):
        TokenPooling("token", class_token=False)


def test_sequence_pooling_is_a_softmax_weighted_mean_of_the_patch_tokens():
    """CCT's y = softmax(z w + b)^T z over the patch tokens; a class token is skipped; the weights are learned."""
    z = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    pool = TokenPooling("sequence", class_token=True, name="pool")
    pooled = ops.convert_to_numpy(pool(z))
    kernel, bias = (ops.convert_to_numpy(w) for w in (pool.score.kernel, pool.score.bias))
    logits = z[:, 1:] @ kernel[:, 0] + bias[0]
    weights = np.exp(logits - logits.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    np.testing.assert_allclose(ops.convert_to_numpy(pool.token_weights(z)), weights, rtol=1e-5)
    np.testing.assert_allclose(pooled, np.einsum("bn,bnd->bd", weights, z[:, 1:]), rtol=1e-5, atol=1e-6)
    assert [w.path for w in pool.trainable_weights] == ["pool/score/kernel", "pool/score/bias"]
    with pytest.raises(ValueError, match="only 'sequence'"):
        TokenPooling("gap", class_token=False).token_weights(z)


def test_locality_self_attention_masks_the_diagonal_and_learns_its_temperature():
    """LSA: no token attends to itself, the logit scale starts at 1/sqrt(d_head), is trained, and is saved."""
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    attn = MultiHeadSelfAttention(2, locality=True)
    _, weights = attn(x, return_attention_scores=True)
    weights = ops.convert_to_numpy(weights)
    np.testing.assert_array_equal(np.diagonal(weights, axis1=-2, axis2=-1), 0.0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert float(ops.convert_to_numpy(attn.logit_scale)) == pytest.approx(0.5)  # 1 / sqrt(8 / 2)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(attn(x) ** 2)
    assert float(tape.gradient(loss, attn.logit_scale)) != 0.0
    block = TransformerBlock(2, 16, locality_attention=True, query_tokens=1)
    assert block(x).shape == (2, 1, 8) and block.attn.locality
    assert TransformerBlock.from_config(block.get_config()).get_config() == block.get_config()


def test_attention_weights_sum_to_one_and_match_fused_path():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, 5, 16)).astype("float32")
    block = TransformerBlock(num_heads=4, mlp_dim=32)
    fused = ops.convert_to_numpy(block(z))
    explicit, weights = block(z, return_attention_scores=True)
    weights = ops.convert_to_numpy(weights)
    assert weights.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(explicit), fused, atol=1e-5)


def test_transformer_block_is_pre_ln_eq2_eq3():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(1, 3, 8)).astype("float32")
    block = TransformerBlock(num_heads=2, mlp_dim=16)
    out = ops.convert_to_numpy(block(z))

    def layer_norm(x, norm):
        gamma, beta = (ops.convert_to_numpy(w) for w in (norm.gamma, norm.beta))
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * gamma + beta

    def dense(x, layer):
        return x @ ops.convert_to_numpy(layer.kernel) + ops.convert_to_numpy(layer.bias)

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    qkv = dense(layer_norm(z, block.norm1), block.attn.qkv).reshape(1, 3, 3, 2, 4)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    heads = softmax(q @ k.transpose(0, 1, 3, 2) / 2.0) @ v
    z1 = dense(heads.transpose(0, 2, 1, 3).reshape(1, 3, 8), block.attn.out) + z
    hidden = dense(layer_norm(z1, block.norm2), block.fc1)
    gelu = 0.5 * hidden * (1 + np.vectorize(__import__("math").erf)(hidden / np.sqrt(2)))
    np.testing.assert_allclose(out, dense(gelu, block.fc2) + z1, atol=1e-5)


def test_query_tokens_compute_the_leading_tokens_of_the_full_block():
    z = np.random.default_rng(3).normal(size=(2, 6, 16)).astype("float32")
    full = TransformerBlock(num_heads=4, mlp_dim=32)
    readout = TransformerBlock(num_heads=4, mlp_dim=32, query_tokens=1)
    expected = ops.convert_to_numpy(full(z))
    readout.build(z.shape)
    readout.set_weights(full.get_weights())
    out = ops.convert_to_numpy(readout(z))
    assert out.shape == (2, 1, 16) == readout.compute_output_shape(z.shape)
    np.testing.assert_allclose(out, expected[:, :1], atol=1e-5)
    out, weights = readout(z, return_attention_scores=True)  # the maps stay whole
    assert ops.convert_to_numpy(weights).shape == (2, 4, 6, 6)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected[:, :1], atol=1e-5)
    with pytest.raises(ValueError, match="query_tokens"):
        TransformerBlock(num_heads=4, mlp_dim=32, query_tokens=0)
    more = TransformerBlock(num_heads=4, mlp_dim=32, query_tokens=8)  # more than T: all T tokens
    more.build(z.shape)
    more.set_weights(full.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(more(z)), expected, atol=1e-5)


def test_symbolic_calls_return_what_eager_calls_return():
    """A functional model can read the attention maps: the symbolic outputs follow the call arguments."""
    x = keras.Input((6, 16))
    y, weights = TransformerBlock(num_heads=4, mlp_dim=32)(x, return_attention_scores=True)
    assert (tuple(y.shape), tuple(weights.shape)) == ((None, 6, 16), (None, 4, 6, 6))
    assert tuple(MultiHeadSelfAttention(4)(x, query_tokens=2).shape) == (None, 2, 16)
    maps = keras.Model(x, weights)(np.zeros((3, 6, 16), "float32"))
    assert tuple(maps.shape) == (3, 4, 6, 6)


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match="hidden_size.*divisible by `num_heads`"):
        TransformerBlock(num_heads=3, mlp_dim=8)(np.zeros((1, 2, 8), "float32"))


def test_drop_path_drops_whole_samples_only_in_training():
    block = TransformerBlock(num_heads=2, mlp_dim=8, drop_path=0.5)
    z = np.ones((64, 3, 8), "float32")
    np.testing.assert_array_equal(ops.convert_to_numpy(block.drop_path_layer(z)), z)
    dropped = ops.convert_to_numpy(block.drop_path_layer(z, training=True))
    per_sample = dropped.reshape(64, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert np.all(per_sample.min(1) == per_sample.max(1))  # whole sample kept or dropped
    assert 0 < (per_sample[:, 0] == 0).sum() < 64



def test_patch_dropout_keeps_the_prefix_and_a_random_subset_of_each_images_own_patches():
    """PatchDropout, training: the prefix tokens first and unchanged, then kept_patches(N, rate) distinct patch
    tokens of the same image (each a row of its own input), a different subset per image; inference: z as is."""
    batch, prefix, patches, width = 6, 2, 16, 4
    z = np.random.default_rng(0).normal(size=(batch, prefix + patches, width)).astype("float32")
    layer = PatchDropout(0.5, prefix_tokens=prefix, seed=1)
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(z)), z)
    out = ops.convert_to_numpy(layer(z, training=True))
    assert kept_patches(patches, 0.5) == 8 and out.shape == (batch, prefix + 8, width)
    np.testing.assert_array_equal(out[:, :prefix], z[:, :prefix])
    chosen = []
    for image in range(batch):
        rows = [int(np.flatnonzero((z[image, prefix:] == token).all(1))[0]) for token in out[image, prefix:]]
        assert len(set(rows)) == 8
        chosen.append(frozenset(rows))
    assert len(set(chosen)) > 1
    assert kept_patches(3, 0.9) == 1  # at least one patch is always kept
    with pytest.raises(ValueError, match="`patch_dropout`.*in \\[0, 1\\); got 1.0"):
        PatchDropout(1.0)
    with pytest.raises(ValueError, match="needs a known token count above its 2 prefix"):
        PatchDropout(0.5, prefix_tokens=2).build((None, None, 4))


def test_a_vit_with_patch_dropout_trains_on_fewer_tokens_and_predicts_as_without(tmp_path):
    """The option costs nothing at inference: with the same weights, the logits of a plain ViT; a training step
    runs through the shorter sequence; the model saves and reloads in safe mode with its rate."""
    from vit_keras.models.vision_transformer import VisionTransformer

    shape = dict(image_size=16, patch_size=4, hidden_size=8, num_heads=2, mlp_dim=16, num_layers=2, num_classes=3)
    plain = VisionTransformer(**shape)
    dropping = plain.rebuild(patch_dropout=0.75)
    assert dropping.patch_dropout_layer.rate == 0.75 and plain.patch_dropout_layer is None
    images = np.random.default_rng(1).normal(size=(4, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(ops.convert_to_numpy(dropping(images)), ops.convert_to_numpy(plain(images)), atol=1e-6)
    tokens = dropping.patch_dropout_layer(dropping.patch_encoder(images), training=True)
    assert tokens.shape[1] == 1 + 4
    dropping.compile(optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    history = dropping.fit(images, np.eye(3)[[0, 1, 2, 0]], epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    path = str(tmp_path / "patch_dropout.keras")
    dropping.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert restored.vit_config["patch_dropout"] == 0.75
    np.testing.assert_allclose(ops.convert_to_numpy(restored(images)), ops.convert_to_numpy(dropping(images)),
                               atol=1e-6)
    with pytest.raises(ValueError, match="`patch_dropout` is a rate"):
        VisionTransformer(**shape, patch_dropout=1.5)

@pytest.mark.parametrize("layer", [
    Patches((2, 4)),
    PatchEncoder(4, 8, (2, 3), class_token=False, position_embedding="learned_2d", dropout=0.1),
    MultiHeadSelfAttention(2, attention_dropout=0.1),
    TransformerBlock(2, 16, dropout=0.1, attention_dropout=0.2, drop_path=0.1, gelu_approximate=True),
    TransformerBlock(2, 16, query_tokens=1),
    TransformerBlock(2, 16, locality_attention=True),
    MultiHeadSelfAttention(2, locality=True),
    TokenPooling("gap", class_token=True),
    TokenPooling("sequence", class_token=False),
])
def test_layer_config_round_trip(layer):
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)


@pytest.mark.parametrize("layer", [
    DropPath(0.1, seed=3),
    PatchDropout(0.5, prefix_tokens=2, seed=3),
    StdConv2D(4, 3, std_epsilon=1e-6),
    ResNetV2Stem((1, 1), width=32),
    ConvStem(4, 32),
])
def test_other_layers_config_round_trip(layer):
    """Every key a layer saves is one its constructor takes, so files saved earlier still load."""
    config = layer.get_config()
    assert type(layer).from_config(config).get_config() == config


@pytest.mark.parametrize("make, typo, nearest", [
    (lambda **kw: PatchEncoder(4, 8, 2, **kw), "patch_szie", "patch_size"),
    (lambda **kw: TransformerBlock(2, 16, **kw), "query_token", "query_tokens"),
    (lambda **kw: TokenPooling(**kw), "poolng", "pooling"),
    (lambda **kw: StdConv2D(4, 3, **kw), "std_epsilom", "std_epsilon"),
    (lambda **kw: ResNetV2Stem(**kw), "depth", "depths"),
])
def test_unknown_layer_keyword_names_the_nearest(make, typo, nearest):
    with pytest.raises(TypeError, match=rf"unknown keyword argument '{typo}' \(did you mean '{nearest}'\?\)"):
        make(**{typo: 1})


def test_keras_base_keywords_still_pass_to_layers():
    encoder = PatchEncoder(4, 8, 2, name="patches", dtype="float32", trainable=False)
    assert encoder.name == "patches" and not encoder.trainable
    block = TransformerBlock(2, 16, name="block", dtype="bfloat16")
    assert block.compute_dtype == "bfloat16"


def test_layers_that_moved_still_import_from_layers():
    """The encoder's layers and the readout moved to modules of their own; ``vit_keras.models.layers`` still has them."""
    import vit_keras.models.encoder
    import vit_keras.models.layers
    import vit_keras.models.readout

    assert vit_keras.models.layers.TransformerBlock is vit_keras.models.encoder.TransformerBlock is vit_keras.TransformerBlock
    assert vit_keras.models.layers.MultiHeadSelfAttention is vit_keras.models.encoder.MultiHeadSelfAttention
    assert vit_keras.models.layers.TokenPooling is vit_keras.models.readout.TokenPooling
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        vit_keras.models.layers.Missing
