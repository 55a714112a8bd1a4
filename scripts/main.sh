#!/usr/bin/env bash
# The README's first command: set up, train a ViT on Fashion-MNIST with the quick recipe, evaluate it.
# Later steps (export, verify, classify) are appended below; keep this a plain sequential script.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# Quick recipe: a small hybrid ViT for 28x28 (resized to 32, conv stem to a 4x4 token grid, 4 blocks). Rerunning resumes an interrupted run,
# and a finished run is not retrained.
.venv/bin/vit-keras train --data fashion_mnist --out runs/fashion_mnist
.venv/bin/vit-keras evaluate runs/fashion_mnist/model.keras --data fashion_mnist \
  --confusion runs/fashion_mnist/confusion.png

# Export: int8 (full integer, uint8 raw-pixel input, calibrated on 300 training images) with TFLite metadata
# (labels, normalization, name), plus the float variants for comparison; then verify every file against Keras
# on the Fashion-MNIST test set (size, LiteRT latency in both runtimes, agreement, accuracy, score error).
for mode in int8 float32 float16 dynamic; do
  .venv/bin/vit-keras export runs/fashion_mnist/model.keras --quantize "$mode" --calibration fashion_mnist \
    --out "runs/fashion_mnist/model_${mode}.tflite"
done
.venv/bin/vit-keras verify runs/fashion_mnist/model_{float32,float16,dynamic,int8}.tflite \
  --against runs/fashion_mnist/model.keras --data fashion_mnist | tee runs/fashion_mnist/verify.md

# App (keep after the export step): classify a few real Fashion-MNIST test images (true label in the file name)
# with the exported int8 model, in the on-device runtime: LiteRT + NumPy + Pillow, labels and normalization
# read from the file's own metadata.
.venv/bin/python -m vit_keras.apps.examples runs/fashion_mnist/test_images 8
.venv/bin/vit-keras classify runs/fashion_mnist/model_int8.tflite runs/fashion_mnist/test_images --top-k 3
