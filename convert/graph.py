"""The export graph: a VisionTransformer's forward pass written for TFLite's int8 kernels.

It reuses the trained weights unchanged and equals the Keras model in float32
(up to rounding), but each piece is formulated so the converter emits builtin
ops that have fast int8 kernels and need no float islands:

- LayerNorm as mean / centre / mean of squares / rsqrt / scale: Keras' own
  LayerNormalization lowers to a NEG (no int8 kernel) that splits every block
  into DEQUANTIZE -> float -> QUANTIZE islands.
- Attention as one qkv FULLY_CONNECTED and 4-D BATCH_MATMULs over all heads, few ops
  a block so a second thread helps (``attention_graph``): no Einsum, no 5-D reshapes;
  1/sqrt(d_head) folded into the q columns. Its heads share the int8 graph's one qkv
  scale, so their ranges are first equalized (``int8.qkv_scales``). The int16 graph
  keeps one head at a time on 3-D tensors.
- Fixed shapes (batch 1 by default), so every reshape is static.
- An RGB input converted to the model's channels inside the graph, and softmax
  scores as the output, the form Android's image classifiers expect.
- The input normalization (the model's pixel_mean / pixel_std) left to the runtime where one mean and std
  describe it (float files), else folded into the graph, which then takes raw pixels: the int8 file's
  uint8 input, and every file of a model normalized per channel, since MediaPipe's ImageClassifier refuses
  per-channel normalization metadata (``takes_raw_pixels``).
"""

import keras
import numpy as np
import tensorflow as tf

from vit_keras import framework
from vit_keras.constants import LUMA_WEIGHTS
from vit_keras.models.normalization import is_uniform, normalize, pixel_normalization
from vit_keras.models.stems import ResNetV2Stem
from vit_keras.models.vision_transformer import VisionTransformer

from .attention_graph import FLOAT_MASK, INTEGER_MASK, attention, dense, numpy
from .attention_output import rollout_graph, token_slice
from . import integer_graph
from .node_names import (GROUPNORM_SHIFT, HEAD, LAYERNORM_EPSILON, LAYERNORM_SHIFT, MLP_IN, MLP_OUT, POSITION_ADD,
                         PRE_LOGITS, RESIDUAL, SEQUENCE_POOL, STEM_POOL, STEM_RESIDUAL)

# Inputs are normalized the way VisionTransformer's "preprocessing" layer does it: (x - mean) / std per channel
# (normalization.pixel_normalization). The luma weights, scaled to sum to 1, commute with a 1-channel model's
# one mean and std.
RGB_TO_GRAY = np.array(LUMA_WEIGHTS, dtype="float32")
RGB_TO_GRAY /= RGB_TO_GRAY.sum()


def check_vit(model, source="model"):
    """Raise a clear error unless ``model`` is a vit_keras VisionTransformer."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"`model` ({source}) is a {type(model).__name__}, not a vit_keras VisionTransformer; "
            "export takes a .keras file saved from vit_keras.create_model / VisionTransformer."
        )
    if not model.vit_config.get("include_top", True):
        raise ValueError(f"`model` ({source}) has no classification head (include_top=False); export a classifier.")
    if any(layer.quantization_mode for layer in framework.flatten_layers(model, include_self=True)):
        raise ValueError(f"`model` ({source}) was quantized by Keras's model.quantize; export the float model (export "
                         "quantizes it itself: --quantize int8|dynamic|float16), or this one with model.export.")
    return model


def layer_norm(layer, x, smooth=None, variances=None):
    """LayerNormalization over the last axis with only int8-friendly builtin ops.

    smooth: a per-channel factor the output is divided by (gamma and beta absorb it; ``smoothing``).
    variances: an ``integer_graph.IntegerRanges``: the full-integer form, which holds in int16
      (``integer_graph.layer_norm``)."""
    gamma, beta = numpy(layer.gamma), numpy(layer.beta)
    if variances is not None:
        return integer_graph.layer_norm(layer, x, gamma, beta, variances)
    centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(centred * centred, axis=-1, keepdims=True)
    inverse = tf.math.rsqrt(tf.add(variance, layer.epsilon, name=LAYERNORM_EPSILON))
    if smooth is None:
        return tf.add(centred * inverse * tf.constant(gamma), tf.constant(beta), name=LAYERNORM_SHIFT)
    # Scaled before the rsqrt's MUL: a constant MUL next to the FULLY_CONNECTED is folded into its kernel by the
    # converter, which would undo the smoothing before int8 sees it. The shift's ADD may fold: it is no range.
    return tf.add((centred * tf.constant(gamma / smooth)) * inverse, tf.constant(beta / smooth),
                  name=LAYERNORM_SHIFT)


def group_norm(layer, x, variances=None):
    """GroupNormalization with layer_norm's int8-friendly ops, on 4-D tensors (no 5-D group reshape).
    variances: as layer_norm's (the piecewise rsqrt)."""
    _, height, width, channels = x.shape
    grouped = tf.reshape(x, (-1, height * width, layer.groups, channels // layer.groups))
    mean = tf.reduce_mean(grouped, axis=[1, 3], keepdims=True)
    centred = grouped - mean
    variance = tf.reduce_mean(centred * centred, axis=[1, 3], keepdims=True)
    shifted = tf.add(variance, layer.epsilon, name=LAYERNORM_EPSILON)
    y = centred * (tf.math.rsqrt(shifted) if variances is None else variances.rsqrt(layer, shifted))
    y = tf.reshape(y, (-1, height, width, channels)) * tf.constant(numpy(layer.gamma))
    return tf.add(y, tf.constant(numpy(layer.beta)), name=GROUPNORM_SHIFT)


def std_conv(layer, x):
    """StdConv2D with its kernel standardized once, here, instead of at every call."""
    kernel = numpy(layer.kernel)
    kernel = (kernel - kernel.mean(axis=(0, 1, 2))) / np.sqrt(kernel.var(axis=(0, 1, 2)) + layer.std_epsilon)
    return tf.nn.conv2d(x, tf.constant(kernel), strides=layer.strides, padding=layer.padding.upper())


def resnet_stem(stem, x, variances=None):
    """ResNetV2Stem.call, with the int8-friendly GroupNorm and pre-standardized kernels."""
    x = tf.nn.relu(group_norm(stem.gn_root, std_conv(stem.conv_root, x), variances))
    x = tf.nn.max_pool2d(x, 3, 2, "SAME", name=STEM_POOL)
    for unit in stem.units:
        residual = x
        if "conv_proj" in unit:
            residual = group_norm(unit["gn_proj"], std_conv(unit["conv_proj"], x), variances)
        y = tf.nn.relu(group_norm(unit["gn1"], std_conv(unit["conv1"], x), variances))
        y = tf.nn.relu(group_norm(unit["gn2"], std_conv(unit["conv2"], y), variances))
        y = group_norm(unit["gn3"], std_conv(unit["conv3"], y), variances)
        x = tf.nn.relu(tf.add(residual, y, name=STEM_RESIDUAL))
    return x


def norm_count(model):
    """How many LayerNorm / GroupNorm layers the model has (each adds one named epsilon node)."""
    kinds = (keras.layers.LayerNormalization, keras.layers.GroupNormalization)
    return sum(isinstance(layer, kinds) for layer in framework.flatten_layers(model))


def patch_embedding(layer, x, pixel_affine=None, column_scale=None):
    """Eq. 1, z0 = [x_class; x_p E] + E_pos, as CONV_2D, RESHAPE, PAD and one ADD: the class token is folded
    into the position table's first row, so no op depends on the batch size (no SHAPE / BROADCAST_TO).

    pixel_affine: per-channel (scale, shift) of the input normalization x * scale + shift, folded into the
    kernel and bias. Exact, since the patches neither overlap nor pad; the converter folds only a scalar one.
    column_scale: (D,) factors on the output's channels (the int16 graph's residual stream scale)."""
    kernel, bias = numpy(layer.kernel), numpy(layer.bias)
    if pixel_affine is not None:
        scale, shift = (np.asarray(v, "float64") for v in pixel_affine)
        bias = (bias + np.einsum("hwcd,c->d", kernel.astype("float64"), shift)).astype("float32")
        kernel = (kernel * scale[:, None]).astype("float32")
    x = tf.nn.bias_add(tf.nn.conv2d(x, kernel, strides=layer.patch_size, padding="VALID"), bias)
    x = tf.reshape(x, (-1, layer.num_patches, layer.hidden_size))
    with tf.init_scope():
        table = layer.position_table()
    rows = layer.num_tokens - layer.register_tokens
    table = np.zeros((1, rows, layer.hidden_size), "float32") if table is None else numpy(table)
    k = layer.positioned_prefix
    if layer.prefix_tokens:  # the class, distillation and register tokens are constants: rows of the table
        tokens = [numpy(layer.cls)] if layer.class_token else []
        tokens += [numpy(layer.dist)] if layer.distillation_token else []
        prefix = table[:, :k] + np.concatenate(tokens, axis=1) if k else table[:, :0]
        registers = numpy(layer.registers) if layer.register_tokens else table[:, :0]
        x = tf.pad(x, [[0, 0], [layer.prefix_tokens, 0], [0, 0]])
        table = np.concatenate([prefix, registers, table[:, k:]], axis=1)
    if column_scale is not None:
        x, table = x * column_scale, table * column_scale
    return tf.add(x, table, name=POSITION_ADD)


def transformer_block(block, z, scales=None, observe=None, norm_scales=None, observe_norm=None, maps=None,
                      variances=None):
    """Eq. 2-3. norm_scales: {layer path: smoothing factor} of the inputs of the dense layers after norm1, norm2
    and the GELU (keyed by fc2's path; ``smoothing.smoothing_scales``); observe_norm(layer, its output or, for
    fc2, its input); maps: a list that gets the block's attention weights appended (``attention``);
    variances: the full-integer LayerNorm's ranges (``layer_norm``)."""
    smooth1, smooth2, smooth3 = ((norm_scales or {}).get(layer.path) for layer in (block.norm1, block.norm2, block.fc2))
    normed = layer_norm(block.norm1, z, smooth1, variances)
    if observe_norm is not None:
        observe_norm(block.norm1, normed)
    mask = FLOAT_MASK if variances is None else INTEGER_MASK
    stream_scale = None if variances is None else variances.stream_scale()
    gamma_1, gamma_2 = layer_scales(block)  # LayerScale, folded into the out projection's and fc2's columns
    y = attention(block.attn, normed, block.query_tokens, scales, observe, row_scale=smooth1, maps=maps, mask=mask,
                  out_scale=scaled_columns(stream_scale, gamma_1), batched=variances is None)
    z = tf.add(token_slice(z, 0, block.query_tokens) if block.query_tokens else z, y, name=RESIDUAL)
    normed = layer_norm(block.norm2, z, smooth2, variances)
    if observe_norm is not None:
        observe_norm(block.norm2, normed)
    if variances is not None:
        variances.observe_stream(z)
        fc1, fc2 = ((layer, numpy(layer.kernel), numpy(layer.bias)) for layer in (block.fc1, block.fc2))
        y = integer_graph.mlp(normed, fc1, fc2, block.gelu_approximate, variances, scaled_columns(stream_scale,
                                                                                                  gamma_2))
        z = tf.add(z, y, name=RESIDUAL)
        variances.observe_stream(z)
        return z
    fc1_kernel = numpy(block.fc1.kernel) * (1.0 if smooth2 is None else smooth2[:, None])
    hidden = tf.nn.gelu(dense(block.fc1, normed, MLP_IN, kernel=fc1_kernel), approximate=block.gelu_approximate)
    if observe_norm is not None:
        observe_norm(block.fc2, hidden)
    fc2_kernel, fc2_bias = numpy(block.fc2.kernel), numpy(block.fc2.bias)
    if smooth3 is not None:  # a (1, 1, D) constant: the converter folds a 1-D one into the next layer's kernel
        hidden = tf.multiply(hidden, tf.constant((1 / smooth3).reshape(1, 1, -1)), name="gelu_smooth")
        fc2_kernel = fc2_kernel * smooth3[:, None]
    if gamma_2 is not None:
        fc2_kernel, fc2_bias = fc2_kernel * gamma_2, fc2_bias * gamma_2
    # named: int8 keeps the residual stream in float
    return tf.add(z, dense(block.fc2, hidden, MLP_OUT, kernel=fc2_kernel, bias=fc2_bias), name=RESIDUAL)


def layer_scales(block):
    """A block's LayerScale vectors (gamma_1, gamma_2), or (None, None) without LayerScale."""
    if block.layer_scale is None:
        return None, None
    return numpy(block.gamma_1), numpy(block.gamma_2)


def scaled_columns(*factors):
    """The product of the (D,) column factors given (None: none), or None where there are none."""
    present = [f for f in factors if f is not None]
    return None if not present else np.prod(present, axis=0).astype("float32")


def takes_raw_pixels(model, quantize):
    """Whether the exported file takes raw 0-255 pixels (normalization metadata mean 0, std 1): int8's uint8
    input, and every file of a model normalized per channel (one mean and std are all the metadata that
    MediaPipe's ImageClassifier takes). Otherwise the runtime normalizes float inputs from the metadata."""
    return quantize == "int8" or not is_uniform(model.vit_config)


def forward(model, images, raw_pixels, qkv_scales=None, observe=None, norm_scales=None, observe_norm=None,
            attention_maps=None, token_weights=None, variances=None):
    """Softmax scores for RGB ``images`` (B, H, W, 3).

    raw_pixels=True: images are 0-255 pixels, normalized here (``takes_raw_pixels``); False: already
    normalized as (x - mean) / std with the model's one mean and std.
    qkv_scales: {attention layer path: per-head (alpha, beta)} for the int8 graph's fused qkv.
    norm_scales: {layer path: per-channel factor} smoothing the blocks' dense inputs (``transformer_block``).
    attention_maps: a list that gets each block's per-head attention weights appended, first block first.
    token_weights: a list that gets sequence pooling's token weights appended (``readout``).
    variances: an ``integer_graph.IntegerRanges``: the full-integer graph (``integer_graph``), recording its
      ranges in an eager pass or applying them when traced.
    """
    x = images
    channels = model.vit_config["channels"]
    if channels not in (1, 3):
        raise ValueError(f"`model` has {channels} input channels; export supports models trained on 1 or 3.")
    mean, std = pixel_normalization(model.vit_config)
    pixel_affine = None  # the normalization, where the patch embedding folds it in
    if raw_pixels and channels == 1:
        x = x * float(1.0 / std[0]) - float(mean[0] / std[0])  # a scalar: the converter folds it into the next conv
    elif raw_pixels and model.vit_config.get("stem"):
        # A stem's first conv has no bias to absorb the normalization's offset, so a plain x * a - b would stay
        # a float MUL at the input (MUL is one of int8's float ops) and the input could not be uint8. As a
        # 1x1 CONV_2D with a bias it quantizes, like the patch embedding of a plain ViT.
        x = tf.nn.bias_add(tf.nn.conv2d(x, tf.constant(np.diag(1.0 / std).astype("float32").reshape(1, 1, 3, 3)),
                                        strides=1, padding="VALID"), tf.constant((-mean / std).astype("float32")))
    elif raw_pixels:
        pixel_affine = (1.0 / std, -mean / std)
    if channels == 1:
        x = tf.nn.conv2d(x, tf.constant(RGB_TO_GRAY.reshape(1, 1, 3, 1)), strides=1, padding="VALID")
    # model.preprocessing is done above, or by the runtime from the normalization metadata
    stem = model.stem
    if isinstance(stem, ResNetV2Stem):
        x = resnet_stem(stem, x, variances)
    elif stem is not None:
        x = stem(x)
    x = patch_embedding(model.patch_encoder, x, pixel_affine, None if variances is None else variances.stream_scale())
    if variances is not None:
        variances.observe_stream(x)
    for block in model.blocks:
        x = transformer_block(block, x, (qkv_scales or {}).get(block.attn.path), observe, norm_scales, observe_norm,
                              maps=attention_maps, variances=variances)
    x = layer_norm(model.encoder_norm, x, variances=variances)
    x = readout(model.pooling_layer, x, token_weights)
    for layer, role in ((model.pre_logits, PRE_LOGITS), (model.head, HEAD)):
        if layer is not None:
            x = dense(layer, x, role)
    return tf.nn.softmax(tf.cast(x, tf.float32), axis=-1)


def readout(pool, x, token_weights=None):
    """Eq. 4's readout (vit_keras.models.readout.TokenPooling) of the normalized tokens (B, T, D): (B, D).
    token_weights: a list that gets sequence pooling's weights over the patch tokens appended, (B, 1, N)."""
    width = x.shape[-1]
    if pool.pooling == "token":  # (B, 1, D) -> (B, D), or a distilled model's (B, 2, D) -> (B, 2D): a RESHAPE
        return tf.reshape(x, (-1, pool.width(width)))
    first = tf.reshape(token_slice(x, 0, 1), (-1, width)) if pool.pooling == "token_gap" else None
    if pool.prefix_tokens:
        x = token_slice(x, pool.prefix_tokens)
    if pool.pooling in ("gap", "token_gap"):
        mean = tf.reduce_mean(x, axis=1)
        return mean if first is None else tf.concat([first, mean], axis=-1)
    tokens = x.shape[1]  # sequence pooling: softmax(z w + b)^T z, as one BATCH_MATMUL
    weights = tf.nn.softmax(tf.reshape(dense(pool.score, x, SEQUENCE_POOL), (-1, 1, tokens)), axis=-1)
    if token_weights is not None:
        token_weights.append(weights)
    return tf.reshape(tf.matmul(weights, x), (-1, width))


def concrete_function(model, raw_pixels, batch_size=1, qkv_scales=None, norm_scales=None, attention_output=False,
                      variances=None):
    """A traced tf.function over an RGB image input; batch_size=None gives a dynamic batch.

    attention_output: a second output, the attention rollout over the patch grid (``rollout_graph``).
    variances: the full-integer normalization's calibrated ranges (``forward``)."""
    check_vit(model)
    height, width = model.vit_config["image_size"]
    spec = tf.TensorSpec((batch_size, height, width, 3), tf.float32, name="image")

    @tf.function(input_signature=[spec], autograph=False)
    def serve(image):
        maps, weights = ([], []) if attention_output else (None, None)
        scores = forward(model, image, raw_pixels, qkv_scales, norm_scales=norm_scales, attention_maps=maps,
                         token_weights=weights, variances=variances)
        if not attention_output:
            return {"scores": scores}

        return [scores, rollout_graph(model, maps, *weights)]

    return serve.get_concrete_function()


def keras_scores(model, images, batch_size=256):
    """The Keras model's softmax scores for uint8 images in its own channel count."""
    logits = model.predict(np.asarray(images, "float32") if model.vit_config["include_preprocessing"]
                           else normalize(images, model.vit_config), batch_size=batch_size, verbose=0)
    logits = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=-1, keepdims=True)
