"""Data: dataset specs to uint8 arrays, and the two input pipelines (tf.data, and NumPy for JAX and PyTorch)."""

from vit_keras.data.datasets import decode_image, load_arrays, load_dataset

__all__ = ["decode_image", "load_arrays", "load_dataset"]
