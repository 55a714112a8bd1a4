"""Eq. 4's readout: the one vector y (B, D) the head sees, from the encoder's normalized output z_L (B, T, D).

    token:     y = z_L^0                                    (the paper's class token)
    gap:       y = mean_t z_L^t                             (global average pooling over the patch tokens)
    sequence:  y = softmax_t(z_L^t w + b)^T z_L             (CCT's sequence pooling, Hassani et al. 2021)
    token_gap: y = [z_L^0; mean_t z_L^t]                    (DINOv2's linear classifier, Oquab et al. 2023)

With DeiT's distillation token, token pooling reads y = [z_L^0; z_L^distil]: one head on both is the average of
DeiT's two heads, (W_cls z^0 + W_distil z^distil) / 2 (``weights.torch`` folds them into one).
GAP and sequence pooling read the patch tokens only: the tokens before them (class, distillation, registers) are
skipped.
"""

import keras
from keras import ops

from vit_keras.constants import POOLINGS
from vit_keras.models.layers import check_layer_keywords, register
from vit_keras.validation import check_choice


@register
class TokenPooling(keras.layers.Layer):
    """The readout of eq. 4 (see the module): ``pooling`` is one of POOLINGS."""

    def __init__(self, pooling="token", class_token=True, prefix_tokens=None, distillation_token=False, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        check_choice(pooling, "pooling", POOLINGS)
        if pooling in ("token", "token_gap") and not class_token:
            raise ValueError(f"`pooling`={pooling!r} needs the class token; use pooling='gap' or 'sequence' with "
                             "class_token=False.")
        self.pooling = pooling
        self.class_token = bool(class_token)
        self.prefix_tokens = int(self.class_token) if prefix_tokens is None else int(prefix_tokens)
        self.distillation_token = bool(distillation_token)
        self.score = None
        if pooling == "sequence":  # w and b: one importance logit a token
            self.score = keras.layers.Dense(1, dtype=self.dtype_policy, name="score")

    def build(self, input_shape):
        if self.score is not None:
            self.score.build(input_shape)

    def patch_tokens(self, z):
        return z[:, self.prefix_tokens:]

    @property
    def read_tokens(self):
        """How many leading tokens the readout reads (the last block computes no others), or None for all."""
        if self.pooling == "token":
            return 1 + int(self.distillation_token)
        return None

    def width(self, hidden_size):
        """y's width: two vectors side by side for token_gap and a distilled class token, else D."""
        return hidden_size * (2 if self.pooling == "token_gap" or self.read_tokens == 2 else 1)

    def token_weights(self, z):
        """Sequence pooling's weights over the patch tokens, (B, N), each row summing to 1."""
        if self.score is None:
            raise ValueError(f"`pooling`={self.pooling!r} has no learned token weights; only 'sequence' does.")
        return ops.softmax(ops.squeeze(self.score(self.patch_tokens(z)), -1), axis=-1)

    def call(self, z):
        if self.pooling == "token":
            return ops.reshape(z[:, :self.read_tokens], (-1, self.width(z.shape[-1])))
        if self.pooling == "gap":
            return ops.mean(self.patch_tokens(z), axis=1)
        if self.pooling == "token_gap":
            return ops.concatenate([z[:, 0], ops.mean(self.patch_tokens(z), axis=1)], axis=-1)
        weights = self.token_weights(z)
        return ops.squeeze(ops.matmul(weights[:, None, :], self.patch_tokens(z)), 1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.width(input_shape[-1]))

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling, "class_token": self.class_token,
                "prefix_tokens": self.prefix_tokens, "distillation_token": self.distillation_token}
