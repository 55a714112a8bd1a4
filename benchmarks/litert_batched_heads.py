"""An experiment (issue 45), a part: does LiteRT at batch 1 scale better to 2 threads with the heads batched into
fewer ops? It replaces the export graph's attention (``convert.graph.attention``: a FULLY_CONNECTED a head and q/k/v,
2 BATCH_MATMULs a head) with one qkv FULLY_CONNECTED and 4-D BATCH_MATMULs over all heads, exports the real
ViT-Ti/16 both ways, and prints top-1 agreement with Keras and 1- and 2-thread latency (docs/benchmarks.md).

    .venv/bin/python benchmarks/litert_batched_heads.py FOLDER PHOTOS.npy   (pretrained_parity.py's --work files)
"""
import math
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
import vit_keras
from vit_keras.convert import graph
from vit_keras.convert.export import export_tflite

from litert_threads import latency_ms  # benchmarks/ is on the path when a script of it runs

def batched_attention(attn, x, query_tokens=None, scales=None, observe=None, row_scale=None, maps=None,
                      mask=graph.FLOAT_MASK, out_scale=None):
    d = x.shape[-1]
    heads, head_dim = attn.num_heads, d // attn.num_heads
    kernel, bias = graph.numpy(attn.qkv.kernel).copy(), graph.numpy(attn.qkv.bias).copy()
    out_kernel, out_bias = graph.numpy(attn.out.kernel).copy(), graph.numpy(attn.out.bias)
    if out_scale is not None:
        out_kernel, out_bias = out_kernel * out_scale, out_bias * out_scale
    scale = 1.0 / math.sqrt(head_dim)
    kernel[:, :d] *= scale
    bias[:d] *= scale
    t = x.shape[1]
    qkv = tf.add(tf.matmul(x, tf.constant(kernel), name=graph.QKV), tf.constant(bias), name=f"{graph.QKV}_bias")
    qkv = tf.transpose(tf.reshape(qkv, (-1, t, 3 * heads, head_dim)), (0, 2, 1, 3))  # (B, 3H, T, Dh)
    q, k, v = tf.split(qkv, 3, axis=1)  # (B, H, T, Dh) each
    if query_tokens:
        q = q[:, :, :query_tokens]
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1)
    y = tf.matmul(weights, v)  # (B, H, Tq, Dh)
    y = tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (-1, y.shape[2], d))
    return graph.dense(attn.out, y, graph.ATTENTION_OUT, kernel=out_kernel, bias=out_bias)

model = vit_keras.from_pretrained(sys.argv[1])
photos = np.load(sys.argv[2])
test = photos[1::10][:100].astype("float32")
calib = photos[::2][:300]
from vit_keras.convert.graph import keras_scores
from vit_keras.convert.runtime import tflite_scores
ref = keras_scores(model, test)
for variant in ("per_head", "batched"):
    if variant == "batched":
        graph.attention = batched_attention
    for mode, act in (("float32", "auto"), ("int8", "dynamic"), ("int8", "static")):
        out = os.path.join(tempfile.gettempdir(), f"heads_{variant}_{mode}_{act}.tflite")
        export_tflite(model, out, quantize=mode, calibration=calib, int8_activations=act)
        got = tflite_scores(out, test)
        one, two = latency_ms(out, 1, runs=60), latency_ms(out, 2, runs=60)
        print(f"{variant:9s} {mode:7s} {act:7s} agree {100*(got.argmax(-1)==ref.argmax(-1)).mean():.0f}%  1T {one:.2f} ms  2T {two:.2f} ms  2T/1T {two/one:.2f}", flush=True)
