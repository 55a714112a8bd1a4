"""Eq. 4's readout: the one vector y (B, D) the head sees, from the encoder's normalized output z_L (B, T, D).

    token:     y = z_L^0                                    (the paper's class token)
    gap:       y = mean_t z_L^t                             (global average pooling over the patch tokens)
    sequence:  y = softmax_t(z_L^t w + b)^T z_L             (CCT's sequence pooling, Hassani et al. 2021)

GAP and sequence pooling read the patch tokens only: a class token, if the model has one, is skipped.
"""

import keras
from keras import ops

from vit_keras.constants import POOLINGS
from vit_keras.models.layers import check_layer_keywords, register
from vit_keras.validation import check_choice


@register
class TokenPooling(keras.layers.Layer):
    """The readout of eq. 4 (see the module): ``pooling`` is one of POOLINGS."""

    def __init__(self, pooling="token", class_token=True, **kwargs):
        check_layer_keywords(self, kwargs)
        super().__init__(**kwargs)
        check_choice(pooling, "pooling", POOLINGS)
        if pooling == "token" and not class_token:
            raise ValueError("`pooling`='token' needs the class token; use pooling='gap' or 'sequence' with "
                             "class_token=False.")
        self.pooling = pooling
        self.class_token = bool(class_token)
        self.score = None
        if pooling == "sequence":  # w and b: one importance logit a token
            self.score = keras.layers.Dense(1, dtype=self.dtype_policy, name="score")

    def build(self, input_shape):
        if self.score is not None:
            self.score.build(input_shape)

    def patch_tokens(self, z):
        return z[:, int(self.class_token):]

    def token_weights(self, z):
        """Sequence pooling's weights over the patch tokens, (B, N), each row summing to 1."""
        if self.score is None:
            raise ValueError(f"`pooling`={self.pooling!r} has no learned token weights; only 'sequence' does.")
        return ops.softmax(ops.squeeze(self.score(self.patch_tokens(z)), -1), axis=-1)

    def call(self, z):
        if self.pooling == "token":
            return z[:, 0]
        if self.pooling == "gap":
            return ops.mean(self.patch_tokens(z), axis=1)
        weights = self.token_weights(z)
        return ops.squeeze(ops.matmul(weights[:, None, :], self.patch_tokens(z)), 1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling, "class_token": self.class_token}
