"""CNN stems for the hybrid models (paper section 3.1, "Hybrid Architecture").

``ResNetV2Stem`` is the paper's ResNet: bottleneck units with weight-standardized
convolutions and GroupNorm(32) instead of BatchNorm (Kolesnikov et al., BiT).
R50+ViT/16 uses stages (3, 4, 9) and ends at stride 16; R50+ViT/32 uses the full
(3, 4, 6, 3) and R26+ViT (2, 2, 2, 2), both ending at stride 32. The ViT then takes 1x1 patches of the feature map.
``r8`` (one stage of two units, width 32, stride 4) is ours: the same design at Fashion-MNIST's size.

``ConvStem`` is a light stem of 3x3 stride-2 convolutions (Xiao et al. 2021,
"Early Convolutions Help Transformers See Better") for small images.

Padding is TensorFlow's "same", which is also what JAX's SAME and timm's
``*Same`` layers do, so checkpoints load without shifting a pixel.
Epsilons default to timm's hybrid ViT (StdConv eps 1e-8, GroupNorm eps 1e-5).
"""

import keras
from keras import ops

from vit_keras.models.layers import check_layer_keywords, register

# Under tf.distribute, BatchNorm statistics over the global batch, not each replica's share: a run on
# N replicas then trains like one device (Keras supports this on the TensorFlow backend only).
SYNC_BN = keras.backend.backend() == "tensorflow"
# name -> (bottleneck units a stage, root width). "r8" is one stage at width 32, stride 4: a hybrid for small
# images (28x28 -> a 7x7 grid), whose stride matches the quick recipe's patch.
RESNET_STEMS = {"r26": ((2, 2, 2, 2), 64), "r50": ((3, 4, 9), 64), "r50_s32": ((3, 4, 6, 3), 64), "r8": ((2,), 32)}


def strided_shape(input_shape, stride, channels):
    """(B, H, W, C) -> the shape of a "same"-padded stem's output: (B, ceil(H / stride), ceil(W / stride), channels)."""
    b, h, w, _ = input_shape
    return (b, None if h is None else -(-h // stride), None if w is None else -(-w // stride), channels)


@register
class StdConv2D(keras.layers.Conv2D):
    """Conv2D whose kernel is standardized (zero mean, unit variance per output filter) at every call."""

    def __init__(self, *args, std_epsilon=1e-8, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(*args, **kwargs)
        self.std_epsilon = float(std_epsilon)

    def convolution_op(self, inputs, kernel):
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        var = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
        return super().convolution_op(inputs, (kernel - mean) / ops.sqrt(var + self.std_epsilon))

    def get_config(self):
        return {**super().get_config(), "std_epsilon": self.std_epsilon}


@register
class ResNetV2Stem(keras.layers.Layer):
    """conv_root 7x7/2 -> GN -> ReLU -> maxpool 3x3/2 -> bottleneck stages (first stride 1, then 2)."""

    def __init__(self, depths=(3, 4, 9), width=64, std_epsilon=1e-8, norm_epsilon=1e-5, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        self.depths = tuple(int(d) for d in depths)
        self.width = int(width)
        self.std_epsilon = float(std_epsilon)
        self.norm_epsilon = float(norm_epsilon)

        def conv(filters, size, stride=1, name=None):
            return StdConv2D(filters, size, strides=stride, padding="same", use_bias=False,
                             std_epsilon=self.std_epsilon, name=name)

        def norm(name, zero=False):
            return keras.layers.GroupNormalization(
                32, epsilon=self.norm_epsilon, gamma_initializer="zeros" if zero else "ones", name=name)

        self.conv_root = conv(self.width, 7, 2, "conv_root")
        self.gn_root = norm("gn_root")
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same")
        self.units = []  # (name, layers dict, stride)
        for b, depth in enumerate(self.depths, start=1):
            features = self.width * 2 ** (b - 1)
            for u in range(1, depth + 1):
                stride = 2 if (u == 1 and b > 1) else 1
                prefix = f"block{b}_unit{u}_"
                unit = {
                    "conv1": conv(features, 1, name=prefix + "conv1"), "gn1": norm(prefix + "gn1"),
                    "conv2": conv(features, 3, stride, prefix + "conv2"), "gn2": norm(prefix + "gn2"),
                    "conv3": conv(features * 4, 1, name=prefix + "conv3"), "gn3": norm(prefix + "gn3", zero=True),
                }
                if u == 1:
                    unit["conv_proj"] = conv(features * 4, 1, stride, prefix + "conv_proj")
                    unit["gn_proj"] = norm(prefix + "gn_proj")
                self.units.append(unit)

    @property
    def stride(self):
        return 4 * 2 ** (len(self.depths) - 1)

    @property
    def output_channels(self):
        return self.width * 2 ** (len(self.depths) - 1) * 4

    def build(self, input_shape):
        shape = input_shape
        for layer in (self.conv_root, self.gn_root):
            layer.build(shape)
            shape = layer.compute_output_shape(shape)
        shape = self.pool.compute_output_shape(shape)
        for unit in self.units:
            y = shape
            for key in ("conv1", "gn1", "conv2", "gn2", "conv3", "gn3"):
                unit[key].build(y)
                y = unit[key].compute_output_shape(y)
            if "conv_proj" in unit:
                unit["conv_proj"].build(shape)
                unit["gn_proj"].build(y)
            shape = y

    def call(self, x):
        x = self.pool(ops.relu(self.gn_root(self.conv_root(x))))
        for unit in self.units:
            residual = x
            if "conv_proj" in unit:
                residual = unit["gn_proj"](unit["conv_proj"](x))
            y = ops.relu(unit["gn1"](unit["conv1"](x)))
            y = ops.relu(unit["gn2"](unit["conv2"](y)))
            y = unit["gn3"](unit["conv3"](y))
            x = ops.relu(residual + y)
        return x

    def compute_output_shape(self, input_shape):
        return strided_shape(input_shape, self.stride, self.output_channels)

    def get_config(self):
        return {
            **super().get_config(), "depths": self.depths, "width": self.width,
            "std_epsilon": self.std_epsilon, "norm_epsilon": self.norm_epsilon,
        }


@register
class ConvStem(keras.layers.Layer):
    """log2(P) blocks of 3x3 stride-2 conv -> BatchNorm -> ReLU, widening to hidden_size / 2.

    BatchNorm momentum is 0.9, not Keras's 0.99: short small-data runs (a few hundred
    steps) otherwise end with stale moving statistics and poor inference accuracy. Its
    statistics are synchronized across replicas (see SYNC_BN).
    """

    def __init__(self, patch_size, hidden_size, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        self.patch_size = int(patch_size)
        self.hidden_size = int(hidden_size)
        steps = self.patch_size.bit_length() - 1
        if self.patch_size < 2 or 2 ** steps != self.patch_size:
            raise ValueError(f"`stem`='conv' needs a power-of-two `patch_size` (2, 4, 8, 16, 32); got {patch_size}.")
        widths = [max(self.hidden_size // 2 ** (steps - i), 16) for i in range(steps)]
        self.blocks = [
            (keras.layers.Conv2D(w, 3, strides=2, padding="same", use_bias=False, name=f"conv{i}"),
             keras.layers.BatchNormalization(momentum=0.9, synchronized=SYNC_BN, name=f"bn{i}"))
            for i, w in enumerate(widths)
        ]
        self.stride = self.patch_size
        self.output_channels = widths[-1]

    def build(self, input_shape):
        shape = input_shape
        for conv, bn in self.blocks:
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            bn.build(shape)

    def call(self, x, training=None):
        for conv, bn in self.blocks:
            x = ops.relu(bn(conv(x), training=training))
        return x

    def compute_output_shape(self, input_shape):
        return strided_shape(input_shape, self.stride, self.output_channels)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "hidden_size": self.hidden_size}
