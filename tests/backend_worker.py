"""Run the model library under the Keras backend of this process; save what it computes.

    KERAS_BACKEND=jax python tests/backend_worker.py OUT_DIR [--load A.keras B.keras ...]

Writes OUT_DIR/<backend>.npz: the logits of every checkpoint layout in tests/fixtures/weights, the attention maps,
``vit_keras.predict``'s outputs, a resized model's logits, the attention heatmap; OUT_DIR/<backend>.keras, a saved model; and the logits of each
``--load`` file as ``loaded/<file stem>``, once the worker writing it has renamed it into place. Also records which heavy modules were imported (TensorFlow must not be
under JAX or PyTorch). Used by tests/test_backends.py.
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import weight_checkpoints as wc  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(HERE), wc.FIXTURES)

# case -> (model name, config, checkpoint, image size): the layouts of tests/test_weights.py
CASES = {
    "google_vit_pre_logits": ("vit_b16", dict(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128,
                                              num_layers=2, num_classes=10, representation_size=64),
                              "google_vit_pre_logits.npz", 32),
    "google_augreg": ("vit_b16", dict(image_size=64, patch_size=16, hidden_size=48, num_heads=3, mlp_dim=96,
                                      num_layers=3, num_classes=7), "google_augreg.npz", 64),
    "big_vision_scan": ("vit_s16", dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64,
                                        num_layers=2, num_classes=5), "big_vision_scan.npz", 32),
    "big_vision_gap": ("vit_h14", dict(image_size=42, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2,
                                       num_classes=4, pooling="gap"), "big_vision_gap.npz", 42),
    "timm_vit": ("vit_b16", dict(image_size=48, patch_size=16, hidden_size=64, num_heads=2, mlp_dim=128,
                                 num_layers=2, num_classes=6), "timm_vit.safetensors", 48),
    "hf_vit_classifier": ("vit_b16", dict(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128,
                                          num_layers=2, num_classes=10, norm_epsilon=1e-12),
                          "hf_vit_classifier.safetensors", 32),
    "hybrid_r26_s32": ("vit_r26_s32", wc.HYBRIDS["hybrid_r26_s32"]["config"], None, 64),
}


def checkpoint_path(case, file_name, out_dir):
    if file_name:
        return os.path.join(FIXTURES, file_name)
    path = os.path.join(out_dir, f"{case}.npz")  # a hybrid: regenerated from its seed, as test_weights does
    if not os.path.exists(path):  # the backends' workers run at once: each writes its own copy, then renames it
        partial = os.path.join(out_dir, f"{case}.{os.getpid()}.npz")
        np.savez(partial, **wc.hybrid_checkpoint(case))
        os.replace(partial, path)
    return path


def wait_for(path, timeout=600):
    """Until another backend's worker has renamed its finished .keras file into place."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout} s")
        time.sleep(0.2)
    return path


def forward(model, images):
    """The model's outputs through its compiled predict step, as a user's ``predict`` runs it. JAX compiles every
    eager op on its own, so eager calls of nine small models were most of its worker's time; the step compiles each
    model once (docs/benchmarks.md, "The test suite")."""
    return np.asarray(model.predict_on_batch(images))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--load", nargs="*", default=[], help="other backends' .keras files, loaded once written")
    args = parser.parse_args()

    import keras

    import vit_keras
    from vit_keras import visualize

    backend = keras.backend.backend()
    numpy = keras.ops.convert_to_numpy  # a torch tensor that needs grad refuses np.asarray
    results = {}
    with np.load(os.path.join(FIXTURES, "expected.npz")) as expected:
        seeds = {case: int(expected[f"{case}/image_seed"]) for case in CASES}
    for case, (name, config, file_name, size) in CASES.items():
        model = vit_keras.create_model(name, weights=checkpoint_path(case, file_name, args.out_dir),
                                       include_preprocessing=False, **config)  # fed normalized images
        results[f"logits/{case}"] = forward(model, wc.images(size, seeds[case]))
    name, config, file_name, size = CASES["google_augreg"]
    model = vit_keras.create_model(name, weights=os.path.join(FIXTURES, file_name), include_preprocessing=False,
                                   **config)
    images = wc.images(size, 1)
    maps = model.attention_maps(images)
    results.update({f"attention/{i}": numpy(m) for i, m in enumerate(maps)})
    results["predict"] = vit_keras.predict(model, np.concatenate([images, images[:1]]), batch_size=2)  # 2 + 1
    results["heatmap"] = np.asarray(visualize.attention_heatmap(model, (images + 1) * 127.5))
    resized = vit_keras.resize_model(model, (96, 80))
    results["resized"] = forward(resized, wc.images((96, 80), 0))
    # Recorded before saving: Keras's own serialization imports TensorFlow whenever it is installed.
    results["modules"] = np.asarray(sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "jax", "torch"}))
    partial = os.path.join(args.out_dir, f"partial_{backend}.keras")
    model.save(partial)
    os.replace(partial, os.path.join(args.out_dir, f"{backend}.keras"))
    for path in args.load:
        model = vit_keras.load_model(wait_for(path))
        results[f"loaded/{os.path.splitext(os.path.basename(path))[0]}"] = forward(model, wc.images(64, 0))
    np.savez(os.path.join(args.out_dir, f"{backend}.npz"), **results)


if __name__ == "__main__":
    main()
