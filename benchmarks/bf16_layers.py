"""The pieces of a ViT block in float32 and bfloat16 under TensorFlow without XLA (the path bfloat16 inference
takes: vit_keras.inference.precision), milliseconds a call at batch 16, 197 tokens. A part, not a whole: it
shows which op eats the bf16 units' gain (docs/benchmarks.md#inference-against-the-peers).

    .venv/bin/python benchmarks/bf16_layers.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def milliseconds(fn, *inputs, repeats=20):
    import tensorflow as tf

    compiled = tf.function(fn, jit_compile=False)
    compiled(*inputs)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            out = compiled(*inputs)
        np.asarray(out)
        best = min(best, (time.perf_counter() - start) / repeats)
    return 1e3 * best


def main():
    import keras
    import tensorflow as tf
    from keras import ops

    from vit_keras.cpu import cpu_features

    print(cpu_features().describe())
    for width, heads in ((192, 3), (768, 12)):
        for dtype in ("float32", "bfloat16"):
            x = tf.cast(tf.random.normal((16, 197, width)), dtype)
            norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
            fc1 = keras.layers.Dense(4 * width, dtype=dtype)
            hidden = fc1(x)
            q = tf.reshape(x, (16, 197, heads, width // heads))
            parts = {
                "LayerNorm": milliseconds(norm, x),
                "fc1": milliseconds(fc1, x),
                "GELU": milliseconds(lambda t: ops.gelu(t, approximate=False), hidden),
                "GELU in float32": milliseconds(
                    lambda t: ops.cast(ops.gelu(ops.cast(t, "float32"), approximate=False), t.dtype), hidden),
                "attention": milliseconds(lambda t: ops.dot_product_attention(t, t, t), q),
            }
            print(f"width {width} {dtype:9}", "  ".join(f"{name} {ms:.2f} ms" for name, ms in parts.items()))


if __name__ == "__main__":
    main()
