"""The Transformer encoder's layers, Dosovitskiy et al. (2020), eq. 2-3 (eq. 1 and 4: vit_keras/layers.py).

    z'l = MSA(LN(z_{l-1})) + z_{l-1}                       (eq. 2)  MultiHeadSelfAttention in a TransformerBlock
    zl  = MLP(LN(z'l)) + z'l                               (eq. 3)  TransformerBlock

Registered under the package name ``vit_keras``, like every layer of the library.
"""

import math

import keras
from keras import ops

from vit_keras.models.layers import DropPath, check_layer_keywords, register


@register
class MultiHeadSelfAttention(keras.layers.Layer):
    """MSA with one fused qkv projection (D, 3D) and an output projection (D, D).

    The fast path calls ``keras.ops.dot_product_attention`` (fused where the
    backend has it; the softmax runs in float32 under mixed precision). When the
    attention weights are asked for, they are computed explicitly as
    softmax(q k^T / sqrt(d_head)) with shape (B, heads, T, T).

    ``locality=True`` is Locality Self-Attention (Lee et al. 2021, "Vision Transformer for Small-Size
    Datasets"): softmax(mask(q k^T * s)), with s a learned scalar (starting at 1 / sqrt(d_head)) and the
    diagonal masked, so no token attends to itself and the weights sharpen on the others.
    """

    def __init__(self, num_heads, attention_dropout=0.0, dropout=0.0, locality=False, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.attention_dropout = float(attention_dropout)
        self.dropout = float(dropout)
        self.locality = bool(locality)
        self.attention_dropout_layer = keras.layers.Dropout(self.attention_dropout)
        self.dropout_layer = keras.layers.Dropout(self.dropout)

    def build(self, input_shape):
        d = input_shape[-1]
        if d % self.num_heads:
            raise ValueError(f"`hidden_size`={d} must be divisible by `num_heads`={self.num_heads}.")
        self.head_dim = d // self.num_heads
        self.qkv = keras.layers.Dense(3 * d, name="qkv")
        self.qkv.build(input_shape)
        self.out = keras.layers.Dense(d, name="out")
        self.out.build(input_shape)
        if self.locality:
            self.logit_scale = self.add_weight(
                name="logit_scale", shape=(), initializer=keras.initializers.Constant(1.0 / math.sqrt(self.head_dim)))

    def attention_logits(self, q, k):
        """q k^T times the logit scale, (B, heads, T, T) in float32; under ``locality`` the diagonal at -1e9."""
        logits = ops.cast(ops.einsum("bthd,bshd->bhts", q, k), "float32")
        if not self.locality:
            return logits * (1.0 / math.sqrt(self.head_dim))
        return logits * ops.cast(self.logit_scale, "float32") - 1e9 * ops.eye(q.shape[1], k.shape[1])

    def call(self, x, training=None, return_attention_scores=False, query_tokens=None):
        """``query_tokens``: outputs for the first k tokens only (keys and values still come from all T).

        The attention weights, when asked for, are always the full (B, heads, T, T).
        """
        t, d = x.shape[1], x.shape[2]
        tq = query_count(t, query_tokens)
        qkv = ops.reshape(self.qkv(x), (-1, t, 3, self.num_heads, self.head_dim))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        use_explicit = return_attention_scores or (training and self.attention_dropout > 0) or self.locality
        # jax.nn.dot_product_attention asks float16 dots for XLA's F16_F16_F32 algorithm, which XLA refuses when it
        # compiles on CPU and on some GPUs ("Unsupported dot precision algorithm: 4"); its fallback only catches
        # errors raised while tracing. The explicit path has plain float16 dots.
        use_explicit = use_explicit or (keras.backend.backend() == "jax" and
                                        keras.backend.standardize_dtype(q.dtype) == "float16")
        if not use_explicit:
            y = ops.dot_product_attention(q[:, :tq], k, v, scale=1.0 / math.sqrt(self.head_dim))
            weights = None
        else:
            weights = ops.cast(ops.softmax(self.attention_logits(q, k), axis=-1), x.dtype)
            kept = self.attention_dropout_layer(weights, training=training)[:, :, :tq]
            y = ops.einsum("bhts,bshd->bthd", kept, v)
        y = self.dropout_layer(self.out(ops.reshape(y, (-1, tq, d))), training=training)
        return (y, weights) if return_attention_scores else y

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_scores=False, query_tokens=None):
        return attention_output_spec(self, x, return_attention_scores, query_tokens)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "attention_dropout": self.attention_dropout,
            "dropout": self.dropout,
            "locality": self.locality,
        }


def gelu(x, approximate=False):
    """GELU(x) = x Phi(x) (Hendrycks and Gimpel 2016), exactly 0.5 x (1 + erf(x / sqrt 2));
    ``approximate``: its tanh form.

    Written out with erf: TensorFlow's exact GELU goes through erfc, which XLA lowers to two polynomial branches
    and an exp, all evaluated; its erf is one rational polynomial (docs/benchmarks.md#gelu-through-erf)."""
    if approximate:
        return ops.gelu(x, approximate=True)
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def query_count(tokens, query_tokens):
    """How many tokens attention answers for: the first ``query_tokens`` (capped at T), or all T."""
    if not query_tokens:
        return tokens
    return query_tokens if tokens is None else min(query_tokens, tokens)


def attention_output_spec(layer, x, return_attention_scores, query_tokens):
    """(B, T', D) in the layer's compute dtype, with the (B, heads, T, T) weights when they are returned:
    Keras builds symbolic outputs from this, so a functional model can read attention maps."""
    b, t, d = x.shape
    y = keras.KerasTensor((b, query_count(t, query_tokens), d), dtype=layer.compute_dtype)
    if not return_attention_scores:
        return y
    return y, keras.KerasTensor((b, layer.num_heads, t, t), dtype=layer.compute_dtype)


@register
class TransformerBlock(keras.layers.Layer):
    """Pre-LN encoder block, eq. 2-3:  z' = MSA(LN(z)) + z;  z = MLP(LN(z')) + z'.

    The MLP is Dense(mlp_dim) -> GELU -> Dense(D), with dropout after each Dense.
    ``gelu_approximate=True`` uses the tanh form of GELU, which quantizes and
    fuses better on device; the default is the exact erf form of the paper.
    ``locality_attention=True``: the MSA is Locality Self-Attention (``MultiHeadSelfAttention(locality=True)``).
    ``layer_scale=e`` (CaiT's LayerScale, Touvron et al. 2021, as DeiT-III and DINOv2 use it): each residual
    branch is scaled per channel by a learned vector initialised to e, z' = z + gamma_1 * MSA(LN(z)), ...
    ``query_tokens=k`` computes z for the first k tokens alone, (B, T, D) -> (B, k, D). Under
    class-token pooling only z_L^0 is read out (eq. 4), so the last block needs k=1: the same
    logits and gradients for 1/L less work.
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path=0.0,
        norm_epsilon=1e-6,
        gelu_approximate=False,
        query_tokens=None,
        locality_attention=False,
        layer_scale=None,
        **kwargs,
    ):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        if query_tokens is not None and int(query_tokens) < 1:
            raise ValueError(f"`query_tokens` must be a positive int or None (all tokens); got {query_tokens}.")
        self.query_tokens = None if query_tokens is None else int(query_tokens)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout = float(dropout)
        self.attention_dropout = float(attention_dropout)
        self.drop_path = float(drop_path)
        self.norm_epsilon = float(norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.locality_attention = bool(locality_attention)
        if layer_scale is not None and not float(layer_scale) > 0:
            raise ValueError(f"`layer_scale` is LayerScale's initial value: a float > 0, or None; got {layer_scale}.")
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.norm1 = keras.layers.LayerNormalization(epsilon=self.norm_epsilon, name="norm1")
        self.attn = MultiHeadSelfAttention(self.num_heads, attention_dropout=self.attention_dropout,
                                           dropout=self.dropout, locality=self.locality_attention, name="attn")
        self.norm2 = keras.layers.LayerNormalization(epsilon=self.norm_epsilon, name="norm2")
        self.mlp_dropout = keras.layers.Dropout(self.dropout)
        self.drop_path_layer = DropPath(self.drop_path)

    def build(self, input_shape):
        d = input_shape[-1]
        if d % self.num_heads:
            raise ValueError(f"`hidden_size`={d} must be divisible by `num_heads`={self.num_heads}.")
        self.norm1.build(input_shape)
        self.attn.build(input_shape)
        self.norm2.build(input_shape)
        self.fc1 = keras.layers.Dense(self.mlp_dim, name="fc1")
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(d, name="fc2")
        self.fc2.build((*input_shape[:-1], self.mlp_dim))
        self.drop_path_layer.build(input_shape)
        if self.layer_scale is not None:
            init = keras.initializers.Constant(self.layer_scale)
            self.gamma_1 = self.add_weight(name="gamma_1", shape=(d,), initializer=init)
            self.gamma_2 = self.add_weight(name="gamma_2", shape=(d,), initializer=init)

    def scaled(self, branch, which):
        """LayerScale's gamma_which * branch; the branch itself without LayerScale."""
        if self.layer_scale is None:
            return branch
        return branch * ops.cast(getattr(self, f"gamma_{which}"), branch.dtype)

    def mlp(self, x, training=None):
        h = self.fc1(x)
        if keras.backend.standardize_dtype(h.dtype) == "bfloat16":  # TensorFlow's CPU GELU is 2-3x slower in bf16
            x = ops.cast(gelu(ops.cast(h, "float32"), approximate=self.gelu_approximate), h.dtype)
        else:
            x = gelu(h, approximate=self.gelu_approximate)
        x = self.mlp_dropout(x, training=training)
        return self.mlp_dropout(self.fc2(x), training=training)

    def call(self, z, training=None, return_attention_scores=False):
        y = self.attn(self.norm1(z), training=training, return_attention_scores=return_attention_scores,
                      query_tokens=self.query_tokens)
        y, weights = y if return_attention_scores else (y, None)
        if self.query_tokens:
            z = z[:, :self.query_tokens]
        z = z + self.drop_path_layer(self.scaled(y, 1), training=training)
        y = self.mlp(self.norm2(z), training=training)
        z = z + self.drop_path_layer(self.scaled(y, 2), training=training)
        return (z, weights) if return_attention_scores else z

    def compute_output_shape(self, input_shape):
        return (input_shape[0], query_count(input_shape[1], self.query_tokens), input_shape[2])

    def compute_output_spec(self, z, training=None, return_attention_scores=False):
        return attention_output_spec(self, z, return_attention_scores, self.query_tokens)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "drop_path": self.drop_path,
            "norm_epsilon": self.norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "query_tokens": self.query_tokens,
            "locality_attention": self.locality_attention,
            "layer_scale": self.layer_scale,
        }
