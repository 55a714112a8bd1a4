"""The layers of a Vision Transformer, following Dosovitskiy et al. (2020), eq. 1-4.

    z0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos        (eq. 1)  PatchEncoder
    z'l = MSA(LN(z_{l-1})) + z_{l-1}                       (eq. 2)  encoder.TransformerBlock
    zl  = MLP(LN(z'l)) + z'l                               (eq. 3)  encoder.TransformerBlock
    y   = LN(zL^0)                                         (eq. 4)  encoder_norm + readout.TokenPooling

This module holds eq. 1 (patches, their embedding), DropPath, PatchDropout and the checks every layer shares; the
encoder's layers (eq. 2-3) are in vit_keras/encoder.py.

Every layer is registered under the package name ``vit_keras`` so a saved
``.keras`` file reloads with ``safe_mode=True`` once ``vit_keras`` is imported.
"""

import functools
import inspect

import keras
import numpy as np
from keras import ops

from vit_keras.constants import POSITION_EMBEDDINGS
from vit_keras.validation import check_choice, check_keywords, pair  # noqa: F401  (pair: the layers' own)

register = keras.saving.register_keras_serializable(package="vit_keras")


@functools.cache
def layer_keywords(cls):
    """Every keyword a layer class's constructor takes: its own, its bases' and keras.layers.Layer's."""
    names = {"input_shape", "input_dim"}  # Keras's Layer takes these through **kwargs too
    for base in cls.__mro__:
        if "__init__" in vars(base):
            parameters = inspect.signature(base.__init__).parameters.values()
            names.update(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if base is keras.layers.Layer:
            break
    names.discard("self")
    return frozenset(names)


def check_layer_keywords(layer, kwargs):
    """Refuse a keyword ``layer`` does not take, naming the nearest valid one (Keras refuses it too, but names none)."""
    check_keywords(kwargs, layer_keywords(type(layer)), type(layer).__name__)


def check_divisible(size, patch_size, what="image_size", by=None):
    """The (rows, columns) grid of ``size`` cut into ``patch_size`` cells, or an error naming ``by`` (default:
    `patch_size`) and the nearest valid size."""
    (h, w), (ph, pw) = pair(size, what), pair(patch_size, "patch_size")
    if h % ph or w % pw:
        raise ValueError(
            f"`{what}`={(h, w)} is not divisible by {by or f'`patch_size`={(ph, pw)}'}; "
            f"use a multiple of it, e.g. {(h // ph * ph or ph, w // pw * pw or pw)}."
        )
    return h // ph, w // pw


@register
class Patches(keras.layers.Layer):
    """(B, H, W, C) images -> (B, N, P*P*C) flattened patches x_p, N = HW/P^2.

    Each patch is flattened in (row, column, channel) order, which is the order of
    a (P, P, C, D) convolution kernel reshaped to (P*P*C, D): so
    ``Patches(P)(x) @ kernel.reshape(-1, D)`` equals ``PatchEncoder``'s projection.
    """

    def __init__(self, patch_size, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        self.patch_size = pair(patch_size, "patch_size")

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"Patches expects images (batch, height, width, channels); got shape {input_shape}.")
        if input_shape[1] is None or input_shape[2] is None:
            raise ValueError(f"Patches needs a known image height and width (the grid is fixed); got {input_shape}.")
        check_divisible(input_shape[1:3], self.patch_size)

    def call(self, images):
        ph, pw = self.patch_size
        _, h, w, c = images.shape
        gh, gw = h // ph, w // pw
        x = ops.reshape(images, (-1, gh, ph, gw, pw, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, gh * gw, ph * pw * c))

    def compute_output_shape(self, input_shape):
        b, h, w, c = input_shape
        ph, pw = self.patch_size
        return (b, (h // ph) * (w // pw), ph * pw * c)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size}


def sincos_2d_embedding(grid, dim, temperature=10000.0):
    """Fixed 2-D sine-cosine position embedding (grid_h * grid_w, dim), as in MoCo v3 / big_vision."""
    if dim % 4:
        raise ValueError(f"`position_embedding`='sincos_2d' needs hidden_size divisible by 4; got {dim}.")
    gh, gw = grid
    y, x = np.meshgrid(np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64), indexing="ij")
    omega = 1.0 / temperature ** (np.arange(dim // 4) / (dim // 4 - 1 if dim > 4 else 1))
    y = y.reshape(-1, 1) * omega[None]
    x = x.reshape(-1, 1) * omega[None]
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype("float32")


@register
class PatchEncoder(keras.layers.Layer):
    """Eq. 1: z0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos.

    The linear projection E is stored as a convolution kernel of shape
    (P, P, C, D) with bias (D,), the layout of the original checkpoints; a
    convolution with kernel = stride = P applies E to every patch at once.
    Input is an image or a CNN feature map (B, H, W, C); output (B, T, D) with
    T = N + 1 when the class token is used (it sits at position 0).

    Tokens after the paper's (the ViTs fine-tuned today):
      distillation_token  DeiT's x_distil after the class token (Touvron et al. 2021), with its own E_pos row;
      register_tokens=R   R learned registers after those (Darcet et al. 2024), without E_pos.
    The sequence is [x_class; x_distil; r_1..r_R; patches]: ``prefix_tokens`` tokens before the patches.

    position_embedding:
      "learned"     a learned (1, T, D) table (the paper's default, 1-D);
      "learned_2d"  learned row and column tables of D/2 each, concatenated per
                    patch (Appendix D.4), plus a learned row for the class token;
      "sincos_2d"   fixed 2-D sine-cosine; the class token gets zeros;
      "none"        no position information.
    """

    def __init__(
        self,
        patch_size,
        hidden_size,
        grid_size,
        class_token=True,
        position_embedding="learned",
        dropout=0.0,
        distillation_token=False,
        register_tokens=0,
        **kwargs,
    ):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        check_choice(position_embedding, "position_embedding", POSITION_EMBEDDINGS)
        if position_embedding == "learned_2d" and hidden_size % 2:
            raise ValueError(f"`position_embedding`='learned_2d' needs an even hidden_size; got {hidden_size}.")
        self.patch_size = pair(patch_size, "patch_size")
        self.hidden_size = int(hidden_size)
        self.grid_size = pair(grid_size, "grid_size")
        self.class_token = bool(class_token)
        self.distillation_token = bool(distillation_token)
        if self.distillation_token and not self.class_token:
            raise ValueError("`distillation_token`=True sits beside the class token: it needs class_token=True.")
        if int(register_tokens) < 0:
            raise ValueError(f"`register_tokens` must be an int >= 0; got {register_tokens}.")
        self.register_tokens = int(register_tokens)
        self.position_embedding = position_embedding
        self.dropout = float(dropout)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.positioned_prefix = int(self.class_token) + int(self.distillation_token)  # tokens with an E_pos row
        self.prefix_tokens = self.positioned_prefix + self.register_tokens
        self.num_tokens = self.num_patches + self.prefix_tokens
        self.dropout_layer = keras.layers.Dropout(self.dropout)

    def build(self, input_shape):
        channels = input_shape[-1]
        if input_shape[1] is not None and input_shape[2] is not None:
            grid = check_divisible(input_shape[1:3], self.patch_size)
            if grid != self.grid_size:
                raise ValueError(
                    f"PatchEncoder was configured for a {self.grid_size} patch grid but gets inputs of "
                    f"spatial size {tuple(input_shape[1:3])} (grid {grid}); resize the position embedding "
                    "with `vit_keras.resize_position_embedding` to change the image size."
                )
        d = self.hidden_size
        self.kernel = self.add_weight(
            name="kernel", shape=(*self.patch_size, channels, d), initializer="lecun_normal"
        )
        self.bias = self.add_weight(name="bias", shape=(d,), initializer="zeros")
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.class_token:
            self.cls = self.add_weight(name="cls", shape=(1, 1, d), initializer="zeros")
        if self.distillation_token:
            self.dist = self.add_weight(name="dist", shape=(1, 1, d), initializer=init)
        if self.register_tokens:
            self.registers = self.add_weight(name="registers", shape=(1, self.register_tokens, d), initializer=init)
        rows = self.num_patches + self.positioned_prefix
        if self.position_embedding == "learned":
            self.pos_embedding = self.add_weight(name="pos_embedding", shape=(1, rows, d), initializer=init)
        elif self.position_embedding == "learned_2d":
            self.pos_row = self.add_weight(name="pos_row", shape=(self.grid_size[0], d // 2), initializer=init)
            self.pos_col = self.add_weight(name="pos_col", shape=(self.grid_size[1], d - d // 2), initializer=init)
            if self.positioned_prefix:
                self.pos_cls = self.add_weight(name="pos_cls", shape=(1, self.positioned_prefix, d), initializer=init)
        elif self.position_embedding == "sincos_2d":
            table = sincos_2d_embedding(self.grid_size, d)
            table = np.concatenate([np.zeros((self.positioned_prefix, d), "float32"), table])
            self.pos_embedding = self.add_weight(
                name="pos_embedding", shape=(1, rows, d),
                initializer=keras.initializers.Constant(table[None]), trainable=False,
            )
        self.input_spec = keras.layers.InputSpec(ndim=4, axes={-1: channels})

    def position_table(self):
        """E_pos as a (1, T - R, D) tensor (no rows for the registers), or None for position_embedding='none'."""
        if self.position_embedding in ("learned", "sincos_2d"):
            return self.pos_embedding
        if self.position_embedding == "learned_2d":
            (gh, gw), d = self.grid_size, self.hidden_size
            rows = ops.broadcast_to(self.pos_row[:, None, :], (gh, gw, d // 2))
            cols = ops.broadcast_to(self.pos_col[None, :, :], (gh, gw, d - d // 2))
            table = ops.reshape(ops.concatenate([rows, cols], axis=-1), (1, gh * gw, d))
            if self.positioned_prefix:
                table = ops.concatenate([self.pos_cls, table], axis=1)
            return table
        return None

    def call(self, x, training=None):
        x = ops.conv(x, ops.cast(self.kernel, x.dtype), strides=self.patch_size, padding="valid")
        x = x + ops.cast(self.bias, x.dtype)
        x = ops.reshape(x, (-1, self.num_patches, self.hidden_size))
        batch = ops.shape(x)[0]
        prefix = [self.cls] if self.class_token else []
        prefix += [self.dist] if self.distillation_token else []
        if prefix:
            x = ops.concatenate([self.repeated(token, batch, x.dtype) for token in prefix] + [x], axis=1)
        table = self.position_table()
        if table is not None:
            x = x + ops.cast(table, x.dtype)
        if self.register_tokens:
            k = self.positioned_prefix
            x = ops.concatenate([x[:, :k], self.repeated(self.registers, batch, x.dtype), x[:, k:]], axis=1)
        return self.dropout_layer(x, training=training)

    def repeated(self, tokens, batch, dtype):
        """A (1, k, D) learned token row, one copy per image: (B, k, D)."""
        return ops.broadcast_to(ops.cast(tokens, dtype), (batch, tokens.shape[1], self.hidden_size))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_tokens, self.hidden_size)

    def get_config(self):
        return {
            **super().get_config(),
            "patch_size": self.patch_size,
            "hidden_size": self.hidden_size,
            "grid_size": self.grid_size,
            "class_token": self.class_token,
            "position_embedding": self.position_embedding,
            "dropout": self.dropout,
            "distillation_token": self.distillation_token,
            "register_tokens": self.register_tokens,
        }


@register
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops a whole residual branch per sample during training."""

    def __init__(self, rate=0.0, seed=None, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"`drop_path` rate must be in [0, 1); got {rate}.")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if rate else None

    def build(self, input_shape):
        # No weights; built as soon as its block is (model.quantize checks every layer is built).
        self.built = True

    def call(self, x, training=None):
        if not training or not self.rate:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = ops.floor(keep + keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype))
        return x / keep * mask

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


def kept_patches(patches, rate):
    """How many of ``patches`` patch tokens an image keeps in training under PatchDropout's ``rate``: at least 1."""
    return max(1, int(patches * (1.0 - rate)))


@register
class PatchDropout(keras.layers.Layer):
    """Trains on a random subset of the patch tokens (Liu et al. 2022, "PatchDropout"): z0 -> [prefix; kept].

    In training each image keeps ``kept_patches(N, rate)`` of its N patch tokens, drawn anew, after E_pos was
    added (so each kept token still says where it came from); the ``prefix_tokens`` (class, distillation,
    registers) always stay. Every block then costs about (1 - rate) as much, which buys a larger image in the same
    time. At inference it passes every token through, so the model's outputs are those of a plain ViT.
    Input and output (B, T, D); in training T becomes prefix_tokens + kept.
    """

    def __init__(self, rate=0.0, prefix_tokens=1, seed=None, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"`patch_dropout` is the share of patch tokens dropped in training: a rate in [0, 1); "
                             f"got {rate}.")
        if int(prefix_tokens) < 0:
            raise ValueError(f"`prefix_tokens` must be an int >= 0; got {prefix_tokens}.")
        self.rate = float(rate)
        self.prefix_tokens = int(prefix_tokens)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.rate else None

    def build(self, input_shape):
        if input_shape[1] is None or input_shape[1] <= self.prefix_tokens:
            raise ValueError(f"PatchDropout needs a known token count above its {self.prefix_tokens} prefix "
                             f"token(s) (the kept count is fixed when the step compiles); got input shape "
                             f"{tuple(input_shape)}.")
        self.built = True

    def call(self, z, training=None):
        patches = z.shape[1] - self.prefix_tokens
        kept = kept_patches(patches, self.rate)
        if not training or kept == patches:
            return z
        noise = keras.random.uniform((ops.shape(z)[0], patches), seed=self.seed_generator)
        _, chosen = ops.top_k(noise, kept, sorted=False)  # a uniform random subset of each image's patches
        kept_tokens = ops.take_along_axis(z[:, self.prefix_tokens:], ops.expand_dims(chosen, -1), axis=1)
        return ops.concatenate([z[:, :self.prefix_tokens], kept_tokens], axis=1)

    def compute_output_shape(self, input_shape):
        return input_shape  # at inference; training's shorter sequence is only ever run, never built

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "prefix_tokens": self.prefix_tokens, "seed": self.seed}


# Layers that lived here before the encoder and the readout got modules of their own: the old imports still work.
MOVED = {"MultiHeadSelfAttention": ".encoder", "TransformerBlock": ".encoder", "TokenPooling": ".readout"}


def __getattr__(name):
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(MOVED[name], __package__), name)
