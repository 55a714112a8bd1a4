"""Data: dataset specs to uint8 arrays or streams from disk, the augmentation settings, and the input pipelines
(tf.data, and NumPy for JAX and PyTorch)."""

from vit_keras.data.augmentation import Augmentation
from vit_keras.data.datasets import decode_image, load_arrays, load_dataset

__all__ = ["Augmentation", "decode_image", "load_arrays", "load_dataset"]
