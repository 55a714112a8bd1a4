"""Make tests/fixtures/kerashub_vit/ (and kerashub_vit_pre_logits/, with a tanh intermediate layer): a tiny
keras-hub ViT image classifier, saved with keras-hub's own ``save_to_preset``, and the logits keras-hub computes
on fixed inputs.

Run with keras-hub 0.32 (its own environment; vit-keras never imports keras-hub):

    python3 -m venv /work/venvs/kerashub
    /work/venvs/kerashub/bin/pip install keras-hub==0.32.0 tensorflow-cpu==2.21.0
    /work/venvs/kerashub/bin/python scripts/make_kerashub_fixture.py

Every weight gets a random value (biases, norms and the class token too, so a swapped or skipped tensor
shows), drawn from a fixed seed: the files are ours, not a pretrained model's. The folder holds what
``save_to_preset`` writes (config.json and model.weights.h5 for the backbone, task.json and task.weights.h5 for
the classifier, preprocessor.json, metadata.json); expected.npz holds the input seed and the logits.
"""

import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "kerashub_vit")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import weight_checkpoints as wc  # noqa: E402  (the fixed inputs the other weight fixtures use)

CONFIG = dict(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
              layer_norm_epsilon=1e-6)
NUM_CLASSES, IMAGE_SEED, WEIGHT_SEED = 5, 21, 7


def make(out, intermediate_dim=None):
    """A random classifier saved to ``out`` with its logits on the fixed inputs."""
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(**CONFIG)
    converter = keras_hub.layers.ViTImageConverter(image_size=(32, 32), scale=1 / 127.5, offset=-1.0)
    preprocessor = keras_hub.models.ViTImageClassifierPreprocessor(image_converter=converter)
    classifier = keras_hub.models.ViTImageClassifier(backbone, NUM_CLASSES, preprocessor=preprocessor,
                                                     intermediate_dim=intermediate_dim)
    rng = np.random.RandomState(WEIGHT_SEED)
    for variable in classifier.weights:
        shape = tuple(variable.shape)
        base = 1.0 if variable.path.endswith("gamma") else 0.0
        variable.assign((base + 0.2 * rng.standard_normal(shape)).astype(np.float32))
    x = wc.images(32, IMAGE_SEED)  # the normalized input the backbone takes, in [-1, 1]
    logits = np.asarray(classifier(x))
    if os.path.isdir(out):
        shutil.rmtree(out)
    classifier.save_to_preset(out)
    np.savez(os.path.join(out, "expected.npz"), logits=logits, image_seed=IMAGE_SEED)
    print(f"wrote {out}: {sorted(os.listdir(out))}; logits {logits.shape}, |logits| max {np.abs(logits).max():.3f}")


def main():
    import keras
    import keras_hub

    print(f"keras {keras.__version__}, keras-hub {keras_hub.__version__}")
    make(OUT)
    make(OUT + "_pre_logits", intermediate_dim=8)  # a tanh layer before the head: our pre_logits


if __name__ == "__main__":
    main()
