"""Keras ViT -> TFLite (float32, float16, dynamic-range, int8) with metadata, and its verification."""
