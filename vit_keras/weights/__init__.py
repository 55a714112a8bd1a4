"""Checkpoints in and out: every format translated to Google's npz names, checked whole, then assigned."""

from vit_keras.weights.loader import checkpoint_normalization, load_weights, save_npz

__all__ = ["checkpoint_normalization", "load_weights", "save_npz"]
