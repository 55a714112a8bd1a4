"""GPU check of the model code: mixed precision, XLA and fused attention, on any Keras backend.

The GPU machine this project can borrow has JAX but no TensorFlow, and nothing can be installed there
but carried wheels (TensorFlow's is ~600 MB). ``vit_keras``'s layers and models use ``keras.ops`` only,
and ``import vit_keras`` loads no TensorFlow, so this imports them from the checkout and runs them under
``KERAS_BACKEND=jax``. It prints, and writes as JSON with ``--json``:

- mixed_bfloat16 / mixed_float16 logits against float32 from the same weights (top-1 agreement, max abs
  difference, output dtype: the logits must stay float32);
- the fused attention path (``ops.dot_product_attention``) against the explicit softmax(q k^T) one, in
  bfloat16: output difference and time per call;
- training throughput (images/s, XLA, AdamW) per precision, with the loss after the timed steps.

    KERAS_BACKEND=jax python benchmarks/gpu_check.py --json gpu_check.json
    python benchmarks/gpu_check.py --models vit_ti16 --image-size 32 --batch 4 --steps 2   # a CPU smoke run
"""

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def load_model_code():
    """vit_keras.layers and vit_keras.models from this checkout (the package import is light: no TensorFlow)."""
    sys.path.insert(0, ROOT)
    from vit_keras import layers, models

    return layers, models


def block_until_ready(x):
    x = x[0] if isinstance(x, (tuple, list)) else x
    return np.asarray(x)  # a host copy waits for the device on every backend


def timed(fn, repeats):
    block_until_ready(fn())  # compile and warm up
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    block_until_ready(out)
    return (time.perf_counter() - start) / repeats


@contextlib.contextmanager
def dtype_policy(policy):
    """Layers built inside take ``policy``; the previous global policy is back afterwards, even on an error."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def build(models, name, policy, image_size, weights=None):
    with dtype_policy(policy):
        model = models.create_model(name, image_size=image_size, num_classes=1000)
    if weights is not None:
        model.set_weights(weights)
    return model


def check_precision(models, name, image_size, batch):
    """Logits of each mixed policy against float32, from the same weights and images."""
    images = np.random.default_rng(0).uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    reference = build(models, name, "float32", image_size)
    weights = reference.get_weights()
    expected = np.asarray(reference.predict_on_batch(images), "float32")
    rows = []
    for policy in POLICIES[1:]:
        model = build(models, name, policy, image_size, weights)
        logits = model.predict_on_batch(images)
        got = np.asarray(logits, "float32")
        rows.append(dict(model=name, policy=policy, logits_dtype=str(logits.dtype),
                         top1_agreement=float(np.mean(got.argmax(-1) == expected.argmax(-1))),
                         max_abs_diff=float(np.max(np.abs(got - expected))),
                         logit_scale=float(np.max(np.abs(expected)))))
    return rows


def check_attention(layers, batch, tokens=197, width=768, heads=12, repeats=20):
    """Fused vs explicit attention in bfloat16 at B/16's shape: same output, and the time of each."""
    import keras
    from keras import ops

    with dtype_policy("mixed_bfloat16"):
        layer = layers.MultiHeadSelfAttention(heads)
    x = ops.convert_to_tensor(np.random.default_rng(1).normal(size=(batch, tokens, width)).astype("float32"))
    layer.build(x.shape)
    if keras.backend.backend() == "jax":
        import jax

        fused = jax.jit(lambda x: layer(x))
        explicit = jax.jit(lambda x: layer(x, return_attention_scores=True)[0])
    else:
        fused = lambda x: layer(x)  # noqa: E731
        explicit = lambda x: layer(x, return_attention_scores=True)[0]  # noqa: E731
    a = np.asarray(fused(x), "float32")
    b = np.asarray(explicit(x), "float32")
    row = dict(shape=[batch, tokens, width, heads], max_abs_diff=float(np.max(np.abs(a - b))),
               output_scale=float(np.max(np.abs(b))),
               fused_ms=1000 * timed(lambda: fused(x), repeats), explicit_ms=1000 * timed(lambda: explicit(x), repeats))
    return row


def check_training(models, name, image_size, batch, steps):
    """img/s of XLA-compiled train steps per precision (float16 with loss scaling), and the final loss."""
    rng = np.random.default_rng(2)
    images = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    labels = rng.integers(0, 1000, batch)
    rows = []
    for policy in POLICIES:
        try:
            rows.append(train_steps(models, name, policy, image_size, images, labels, steps))
        except Exception as error:  # report and go on: one failing policy should not hide the others
            traceback.print_exc()
            rows.append(dict(model=name, policy=policy, error=f"{type(error).__name__}: {str(error)[:300]}"))
    return rows


def train_steps(models, name, policy, image_size, images, labels, steps):
    """One precision: compile, two warm-up steps, then ``steps`` timed ones."""
    import keras

    keras.utils.set_random_seed(0)
    model = build(models, name, policy, image_size)
    optimizer = keras.optimizers.AdamW(1e-4, weight_decay=0.05, global_clipnorm=1.0)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    first = float(model.train_on_batch(images, labels))  # compiles
    model.train_on_batch(images, labels)
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(images, labels)
    loss = float(loss)  # waits for the last step
    seconds = time.perf_counter() - start
    return dict(model=name, policy=policy, batch=len(images), img_per_s=len(images) * steps / seconds,
                first_loss=first, loss_after=loss)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_ti16,vit_b16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per precision")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--checks", default="precision,attention,training")
    args = parser.parse_args(argv)

    import keras

    layers, models = load_model_code()
    report = dict(backend=keras.backend.backend(), keras=keras.__version__)
    if keras.backend.backend() == "jax":
        import jax

        report.update(jax=jax.__version__, devices=[str(d) for d in jax.devices()])
    print(json.dumps(report))

    def record(key, rows):
        report[key] = rows
        for row in rows if isinstance(rows, list) else [rows]:
            print(key, json.dumps(row), flush=True)
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    names, checks = args.models.split(","), args.checks.split(",")
    if "precision" in checks:
        record("precision", [row for name in names for row in check_precision(models, name, args.image_size, 32)])
    if "attention" in checks:
        record("attention", check_attention(layers, args.batch if args.image_size >= 224 else 2,
                                            repeats=20 if args.image_size >= 224 else 2))
    for name in names if "training" in checks else ():
        record(f"training_{name}", check_training(models, name, args.image_size, args.batch, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
