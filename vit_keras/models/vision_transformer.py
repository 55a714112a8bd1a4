"""The ViT model: configs table, ``VisionTransformer`` and ``create_model``.

    image -> [Rescaling] -> [stem] -> PatchEncoder -> TransformerBlock x L -> LayerNorm
          -> pooling (token | gap | sequence) -> [pre_logits tanh] -> head

Under token pooling the last block computes the class token alone (``query_tokens=1``):
its other outputs are never read, so the logits and gradients are the same for less work.

``VisionTransformer`` is a functional Keras model whose constructor arguments are
its config, so it saves to ``.keras`` and reloads with ``safe_mode=True``.
"""

import inspect
import os

import keras
import numpy as np
from keras import ops

from vit_keras import framework
from vit_keras.constants import POOLINGS, POSITION_EMBEDDINGS
from vit_keras.models import stems
from vit_keras.models.encoder import TransformerBlock
from vit_keras.models.layers import PatchDropout, PatchEncoder, check_choice, check_divisible, pair, register
from vit_keras.models.normalization import check_normalization, check_pixels, input_description, rescaling_layer
from vit_keras.models.position import resize_axis_embedding, resize_position_embedding
from vit_keras.models.readout import TokenPooling
from vit_keras.validation import check_keywords

STEMS = (None, *stems.RESNET_STEMS, "conv")
CONFIG_KEYS = ("patch_size", "hidden_size", "num_heads", "mlp_dim", "num_layers")

# The names of a VisionTransformer's layers, by part: saved files and the export graph find the parts by them.
LAYER_NAMES = dict(preprocessing="preprocessing", stem="stem", patch_encoder="embedding",
                   patch_dropout="patch_dropout", encoder_norm="encoder_norm", pooling_layer="pool",
                   pre_logits="pre_logits", head="head")
BLOCK_NAME = "encoderblock_{}"


def _part(part, doc):
    """A VisionTransformer property: the layer for ``part`` (see LAYER_NAMES), or None where the model has none."""
    name = LAYER_NAMES[part]

    def layer(model):
        parts = model.__dict__.get("_parts_by_name")
        if parts is None:  # a functional model's layers are fixed once built: index them once
            parts = {layer.name: layer for layer in model.layers}
            if parts:
                object.__setattr__(model, "_parts_by_name", parts)  # not a tracked attribute
        return parts.get(name)

    return property(layer, doc=doc)


@register
class VisionTransformer(keras.Model):
    """A ViT (or hybrid) as a functional model.

    Input: (B, H, W, channels) images normalized as (pixel / 255 - pixel_mean) / pixel_std per channel
    (None: the Google checkpoints' 0.5, i.e. pixel / 127.5 - 1), or raw 0-255 pixels when
    ``include_preprocessing=True`` (the "preprocessing" layer then normalizes them).
    pixel_mean, pixel_std: ``channels`` values in [0, 1] (timm's units), or a preset name ('imagenet', 'inception').
    Output: logits (B, num_classes), or pooled features (B, D) without the top.
    class_names: the label of each class, in index order (None: unnamed); saved with the model, so ``predict``'s
    ``top_k`` and the exported file's labels read them. ``input_description`` and ``repr`` say which input the
    model takes, and ``fit``/``evaluate``/``predict`` refuse an array batch obviously scaled for the other one.
    For small data (Lee et al. 2021; Hassani et al. 2021): ``locality_attention=True`` (every block's MSA masks
    its diagonal and learns its temperature) and ``pooling="sequence"``.
    The ViTs fine-tuned today add: ``distillation_token`` (DeiT), ``register_tokens`` (DINOv2's registers),
    ``layer_scale`` (LayerScale's initial value: DeiT-III, DINOv2), ``pooling="token_gap"`` (DINOv2's classifier).
    ``patch_dropout``: the share of patch tokens dropped in training (``PatchDropout``; inference keeps all).
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        hidden_size=768,
        num_heads=12,
        mlp_dim=3072,
        num_layers=12,
        num_classes=1000,
        channels=3,
        pooling="token",
        position_embedding="learned",
        class_token=None,
        stem=None,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path=0.0,
        patch_dropout=0.0,
        representation_size=None,
        include_top=True,
        include_preprocessing=False,
        pixel_mean=None,
        pixel_std=None,
        norm_epsilon=1e-6,
        gelu_approximate=False,
        locality_attention=False,
        class_names=None,
        distillation_token=False,
        register_tokens=0,
        layer_scale=None,
        name="vit",
        **kwargs,
    ):
        check_keywords(kwargs, VIT_KEYWORDS, "VisionTransformer")
        check_choice(pooling, "pooling", POOLINGS)
        check_choice(position_embedding, "position_embedding", POSITION_EMBEDDINGS)
        check_choice(stem, "stem", STEMS)
        image_size = pair(image_size, "image_size")
        for key, value in dict(hidden_size=hidden_size, num_heads=num_heads, num_layers=num_layers, mlp_dim=mlp_dim,
                               channels=channels, representation_size=representation_size or 1).items():
            if int(value) < 1:
                raise ValueError(f"`{key}` must be a positive int; got {value}.")
        if hidden_size % num_heads:
            raise ValueError(f"`hidden_size`={hidden_size} must be divisible by `num_heads`={num_heads}.")
        for key, value in dict(dropout=dropout, attention_dropout=attention_dropout, drop_path=drop_path,
                               patch_dropout=patch_dropout).items():
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"`{key}` is a rate: it must be in [0, 1); got {value}.")
        if not float(norm_epsilon) > 0:
            raise ValueError(f"`norm_epsilon` must be > 0; got {norm_epsilon}.")
        if include_top and int(num_classes) < 1:
            raise ValueError(f"`num_classes` must be >= 1 with include_top=True; got {num_classes}.")
        if class_token is None:
            class_token = pooling in ("token", "token_gap")
        pixel_mean, pixel_std = check_normalization(pixel_mean, pixel_std, int(channels))
        class_names = check_class_names(class_names, num_classes if include_top else None)
        config = dict(
            image_size=image_size, patch_size=patch_size, hidden_size=hidden_size, num_heads=num_heads,
            mlp_dim=mlp_dim, num_layers=num_layers, num_classes=num_classes, channels=channels,
            pooling=pooling, position_embedding=position_embedding, class_token=class_token, stem=stem,
            dropout=dropout, attention_dropout=attention_dropout, drop_path=drop_path,
            patch_dropout=float(patch_dropout), representation_size=representation_size, include_top=include_top,
            include_preprocessing=include_preprocessing, pixel_mean=pixel_mean, pixel_std=pixel_std,
            norm_epsilon=norm_epsilon, gelu_approximate=gelu_approximate, locality_attention=locality_attention,
            class_names=class_names, distillation_token=bool(distillation_token), register_tokens=int(register_tokens),
            layer_scale=layer_scale,
        )

        images = keras.Input((*image_size, channels), name="images")
        x = images
        if include_preprocessing:
            x = rescaling_layer(config, LAYER_NAMES["preprocessing"])(x)
        stem_stride = 1
        if stem is not None:
            patch = pair(patch_size, "patch_size")
            if patch[0] != patch[1]:
                raise ValueError(f"`stem`={stem!r} downsamples both sides alike: `patch_size` must be square; "
                                 f"got {patch_size}.")
            if stem == "conv":
                stem_layer = stems.ConvStem(patch[0], hidden_size, name=LAYER_NAMES["stem"])
            else:
                depths, width = stems.RESNET_STEMS[stem]
                stem_layer = stems.ResNetV2Stem(depths, width, name=LAYER_NAMES["stem"])
                if patch[0] != stem_layer.stride:
                    raise ValueError(f"`stem`={stem!r} downsamples by {stem_layer.stride} and the encoder takes 1x1 "
                                     f"patches of its feature map, so `patch_size` must be {stem_layer.stride}; "
                                     f"got {patch_size}.")
            stem_stride = stem_layer.stride
            check_divisible(image_size, stem_stride, by=f"the {stem!r} stem's stride {stem_stride}")
            x = stem_layer(x)
        encoder_patch = 1 if stem else patch_size
        grid = check_divisible((image_size[0] // stem_stride, image_size[1] // stem_stride), encoder_patch,
                               what="image_size" if stem is None else "feature map size")
        tokens = PatchEncoder(encoder_patch, hidden_size, grid, class_token=class_token,
                              position_embedding=position_embedding, dropout=dropout,
                              distillation_token=distillation_token, register_tokens=register_tokens,
                              name=LAYER_NAMES["patch_encoder"])
        pool = TokenPooling(pooling, class_token, tokens.prefix_tokens, tokens.distillation_token,
                            name=LAYER_NAMES["pooling_layer"])
        x = tokens(x)
        if patch_dropout:
            x = PatchDropout(patch_dropout, tokens.prefix_tokens, name=LAYER_NAMES["patch_dropout"])(x)
        for i in range(num_layers):
            rate = drop_path * i / max(num_layers - 1, 1)  # linearly increasing stochastic depth
            readout = pool.read_tokens if i == num_layers - 1 else None  # only these tokens of z_L are read out
            x = TransformerBlock(num_heads, mlp_dim, dropout=dropout, attention_dropout=attention_dropout,
                                 drop_path=rate, norm_epsilon=norm_epsilon, gelu_approximate=gelu_approximate,
                                 query_tokens=readout, locality_attention=locality_attention,
                                 layer_scale=layer_scale, name=BLOCK_NAME.format(i))(x)
        x = keras.layers.LayerNormalization(epsilon=norm_epsilon, name=LAYER_NAMES["encoder_norm"])(x)
        x = pool(x)
        if representation_size:
            x = keras.layers.Dense(representation_size, activation="tanh", name=LAYER_NAMES["pre_logits"])(x)
        if include_top:
            x = keras.layers.Dense(num_classes, name=LAYER_NAMES["head"], dtype=_float32_policy())(x)
        super().__init__(inputs=images, outputs=x, name=name, **kwargs)
        self.vit_config = config

    # Functional models rebuild from their constructor arguments, like keras-hub's backbones. A model quantized by
    # model.quantize also records its quantized layers' dtype policies: rebuilt, they get them back before the
    # weights load, so each layer has the quantized variables the file holds.
    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable, **plain(self.vit_config)}
        quantized = {path: keras.dtype_policies.serialize(layer.dtype_policy) for path, layer in sublayers(self)
                     if layer.dtype_policy.quantization_mode}
        return {**config, QUANTIZED_LAYERS: quantized} if quantized else config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        quantized = config.pop(QUANTIZED_LAYERS, None) or {}
        model = cls(**config)
        if not quantized:
            return model
        layers = dict(sublayers(model))
        with framework.one_garbage_collection():
            for path, policy in quantized.items():
                if path not in layers:
                    raise ValueError(f"`{QUANTIZED_LAYERS}` names layer {path!r}, which this model does not have.")
                layers[path].dtype_policy = keras.dtype_policies.deserialize(policy)  # quantizes the built layer
        return model

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras's ``quantize``, with one garbage collection instead of one for each layer it quantizes."""
        with framework.one_garbage_collection():
            super().quantize(mode, config=config, filters=filters, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras's export. A model that ``quantize`` made int8 or float8 exports to LiteRT as its float twin,
        int8 weights kept in int8 (vit_keras.convert.keras_export: TFLite has no kernels for those Keras ops)."""
        if format == "litert":
            from vit_keras.convert import keras_export

            if keras_export.needs_twin(self):
                return keras_export.export_litert(self, filepath, verbose, input_signature, **kwargs)
        return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)

    def __repr__(self):
        config = self.vit_config
        h, w = config["image_size"]
        out = f"{config['num_classes']} classes" if config["include_top"] else "features"
        return f"<VisionTransformer {self.name}: {h}x{w}x{config['channels']} {self.input_description} -> {out}>"

    @property
    def takes_raw_pixels(self):
        """Whether the model takes raw 0-255 pixels (``include_preprocessing=True``), not normalized ones."""
        return bool(self.vit_config["include_preprocessing"])

    @property
    def input_description(self):
        """The input the model takes, in words: raw pixels, or pixels normalized as it was trained."""
        return input_description(self.vit_config)

    @property
    def class_names(self):
        """The label of each class in index order, or None where the model has none."""
        names = self.vit_config.get("class_names")
        return None if names is None else list(names)

    def fit(self, x=None, y=None, *args, **kwargs):
        check_pixels(x, self.vit_config, "x")
        framework.build_optimizer(self)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        check_pixels(x, self.vit_config, "x")
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        check_pixels(x, self.vit_config, "x")
        return super().predict(x, *args, **kwargs)

    def call(self, inputs, training=None, mask=None):
        channels, got = self.vit_config["channels"], inputs.shape[-1]
        if got is not None and got != channels:
            raise ValueError(
                f"{self.name} takes images with `channels`={channels} (shape (batch, "
                f"{', '.join(map(str, self.vit_config['image_size']))}, {channels})); got shape {tuple(inputs.shape)}."
            )
        return super().call(inputs, training=training, mask=mask)

    preprocessing = _part("preprocessing", "The Rescaling of 0-255 pixels by pixel_mean / pixel_std "
                                           "(include_preprocessing=True), or None.")
    stem = _part("stem", "The CNN stem (ResNetV2Stem or ConvStem), or None.")
    patch_encoder = _part("patch_encoder", "The PatchEncoder: patch embedding, class token and E_pos (eq. 1).")
    patch_dropout_layer = _part("patch_dropout", "The PatchDropout of training's tokens, or None without it.")
    encoder_norm = _part("encoder_norm", "The LayerNormalization after the last block (eq. 4).")
    pooling_layer = _part("pooling_layer", "The TokenPooling readout (class token, GAP or sequence pooling).")
    pre_logits = _part("pre_logits", "The tanh representation layer (representation_size), or None.")
    head = _part("head", "The classification Dense layer, or None with include_top=False.")

    @property
    def grid_size(self):
        return self.patch_encoder.grid_size

    @property
    def blocks(self):
        """The TransformerBlocks, in order (eq. 2-3)."""
        return [layer for layer in self.layers if isinstance(layer, TransformerBlock)]

    def rebuild(self, **changes):
        """A new VisionTransformer of this config with ``changes`` applied, holding every weight that still fits.

        Layers are matched by name, their weights by path and shape. The learned position tables are first
        resampled to the new patch grid (fixed sincos tables are the new model's own), as for fine-tuning at
        a higher resolution. A head that no longer fits starts at zero: the paper's fine-tuning (section 3.2).
        """
        config = {**self.get_config(), **changes}
        if config["num_classes"] != self.vit_config["num_classes"] and "class_names" not in changes:
            config["class_names"] = None  # a new head: its classes are not the old ones
        model = VisionTransformer.from_config(config)
        sources = {layer.name: layer for layer in self.layers}
        for target in model.layers:
            source = sources.get(target.name)
            if source is None or type(source) is not type(target) or not target.weights:
                continue
            values = {_relative_path(source, v): ops.convert_to_numpy(v) for v in source.weights}
            if isinstance(target, PatchEncoder):
                values = _fit_position_tables(source, target, values)
            fitting = [(variable, values.get(_relative_path(target, variable))) for variable in target.weights]
            fitting = [(variable, value) for variable, value in fitting
                       if value is not None and value.shape == tuple(variable.shape)]
            if target is model.head and len(fitting) < len(target.weights):  # a new head
                fitting = [(variable, np.zeros(variable.shape)) for variable in target.weights]
            for variable, value in fitting:
                variable.assign(value.astype(variable.dtype))
        return model

    def attention_maps(self, images, batch_size=32):
        """Every block's attention weights for ``images``: a list of L arrays (B, heads, T, T)."""
        per_layer = []
        images = np.asarray(images, dtype="float32")
        if images.ndim != 4 or not len(images):
            raise ValueError(f"`images` must be a non-empty batch (B, H, W, C); got shape {images.shape}.")
        for start in range(0, len(images), batch_size):
            x = ops.convert_to_tensor(images[start:start + batch_size])
            for layer in self.layers[1:]:
                if isinstance(layer, TransformerBlock):
                    x, weights = layer(x, return_attention_scores=True)
                    per_layer.append(ops.convert_to_numpy(weights))
                    continue
                if layer is self.encoder_norm:
                    break
                x = layer(x)
        n = len(self.blocks)
        return [np.concatenate(per_layer[i::n]) for i in range(n)]


QUANTIZED_LAYERS = "quantized_layers"  # get_config's key: {layer path in the model: its quantized dtype policy}
VIT_KEYWORDS = frozenset(inspect.signature(VisionTransformer.__init__).parameters) - {"self", "kwargs"} | {"trainable"}


def plain(value):
    """A copy of ``value`` with Keras's tracked lists and dicts turned into plain ones: a tracked one holds the model
    that tracks it, so deep-copying it copies the whole model (docs/training.md#the-first-step)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def check_class_names(class_names, num_classes):
    """``class_names`` as a list of ``num_classes`` strings (None: none), or a clear error."""
    if class_names is None:
        return None
    if isinstance(class_names, str) or not all(isinstance(name, str) for name in class_names):
        raise ValueError(f"`class_names` must be a list of strings, one a class; got {class_names!r}.")
    if num_classes is None or len(class_names) != int(num_classes):
        raise ValueError(f"`class_names` has {len(class_names)} names, but the model has "
                         f"{'no head' if num_classes is None else f'{num_classes} classes'}: give one name a class.")
    return list(class_names)


def _relative_path(layer, variable):
    """A weight's path inside its layer, e.g. 'attn/qkv/kernel' in a TransformerBlock."""
    return variable.path.removeprefix(layer.path + "/")


def _fit_position_tables(source, target, values):
    """A PatchEncoder's weight values (relative path -> array) with E_pos refitted from ``source`` to ``target``."""
    if source.position_embedding != target.position_embedding or source.position_embedding == "sincos_2d":
        return {key: value for key, value in values.items() if not key.startswith("pos_")}  # no table carries over
    old, new = source.grid_size, target.grid_size
    if "pos_embedding" in values:
        values["pos_embedding"] = resize_position_embedding(values["pos_embedding"], new, old, source.positioned_prefix)
    for key, axis in (("pos_row", 0), ("pos_col", 1)):
        if key in values:
            values[key] = resize_axis_embedding(values[key], new[axis])
    return values


def sublayers(model):
    """(path inside ``model``, layer) of every layer under its top-level layers, e.g. 'encoderblock_0/attn/qkv'."""
    for top in model.layers:
        for layer in framework.flatten_layers(top, include_self=True):
            if top.path and layer.path:  # an InputLayer has none
                yield top.name + layer.path.removeprefix(top.path), layer


def _float32_policy():
    """Logits stay float32 under mixed precision, for a stable softmax/loss."""
    return "float32" if keras.mixed_precision.dtype_policy().name != "float32" else None


def vision_transformer_of(model):
    """The ``VisionTransformer`` in ``model``: the model itself, or the one it wraps (the old API's activations)."""
    if isinstance(model, VisionTransformer):
        return model
    inner = [layer for layer in getattr(model, "layers", []) if isinstance(layer, VisionTransformer)]
    if len(inner) != 1:
        raise ValueError(f"`model` must be a vit_keras VisionTransformer or a model wrapping exactly one; "
                         f"got {type(model).__name__} with {len(inner)}.")
    return inner[0]


def load_model(path):
    """A saved VisionTransformer (.keras, safe mode), with a clear error for a missing or foreign file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`model` file {path!r} does not exist.")
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for a foreign file
        raise ValueError(f"`model` file {path!r} is not a Keras model saved by vit_keras: {error}") from error
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"`model` file {path!r} holds a {type(model).__name__}, not a vit_keras VisionTransformer "
                         "(vit_keras.create_model / VisionTransformer).")
    return model


def resize_model(model, image_size):
    """A copy of a ``VisionTransformer`` at another image size, its position embedding resampled.

    This is the paper's fine-tuning at a higher resolution (e.g. 224 -> 384),
    and works square <-> rectangular.
    """
    return model.rebuild(image_size=image_size)
