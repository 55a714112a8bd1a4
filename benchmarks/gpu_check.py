"""GPU check: the real trainer (``vit_keras.training.train.train``) under Keras's JAX backend, beside timm on the same card.

The GPU machine this project borrows has JAX, PyTorch and timm but no TensorFlow, and nothing can be
installed there: this runs from the checkout (``import vit_keras`` loads no TensorFlow; the trainer feeds
``fit`` from the NumPy pipeline under JAX). One run, a few minutes, prints and writes (``--json``):

- ``timm``: timm's training img/s for the same model, batch and size with ``torch.autocast(bfloat16)``,
  eager and with ``torch.compile`` (or the error), measured first in a child process so that JAX, which
  holds the card's memory once started, does not share it;
- ``trainer``: ``train.train`` on a synthetic folder dataset (or ``--data``) in mixed_bfloat16: the
  steady epoch's img/s as the run's history.csv records it (the input pipeline included), and its share
  of the card's bf16 matmul rate (``--peak-tflops``, ~790 measured on the H200);
- ``step``: the same model's compiled train step alone on one device-resident batch (what timm's figure
  measures), img/s and share of the peak;
- ``float16``: whether mixed_float16 (with loss scaling) compiles and trains (or the error text), and which
  parts of a float16 ViT compile on their own, forward and gradient (a matmul, the patch convolution,
  LayerNorm, both attention paths, jax.nn.dot_product_attention bare, a block, a small model): the bare
  fused op asks XLA for the F16_F16_F32 dot algorithm that CPUs and some GPUs refuse, which is why
  ``MultiHeadSelfAttention`` takes its explicit path in float16 under JAX.

    KERAS_BACKEND=jax python benchmarks/gpu_check.py --json gpu_check.json   # on the GPU machine
    python benchmarks/gpu_check.py --cpu                                      # a tiny end-to-end run here
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TRAINING_FLOPS_PER_FORWARD = 3  # forward + backward (gradients of activations and of weights)


def error_text(error):
    return f"{type(error).__name__}: {str(error)[:2000]}"


def write_synthetic_folder(path, count, size, classes=10, seed=0):
    """``count`` RGB PNGs in ``classes`` sub-folders: a class-dependent gradient plus noise (learnable, small)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    for index in range(count):
        label = index % classes
        folder = os.path.join(path, f"class_{label}")
        os.makedirs(folder, exist_ok=True)
        angle = np.pi * label / classes
        base = 0.5 + 0.5 * np.sin(8 * (np.cos(angle) * x + np.sin(angle) * y))
        image = np.clip(base[..., None] * [200, 150, 100] + rng.normal(0, 20, (size, size, 3)), 0, 255)
        Image.fromarray(image.astype(np.uint8)).save(os.path.join(folder, f"{index}.png"), compress_level=1)
    return path


def matmul_share(img_per_s, name, image_size, peak_tflops):
    from vit_keras.inference.bench import vit_flops

    tflops = img_per_s * TRAINING_FLOPS_PER_FORWARD * vit_flops(name, image_size) / 1e12
    return dict(model_tflops=round(tflops, 1), share_of_peak=round(tflops / peak_tflops, 3) if peak_tflops else None)


def run_trainer(args, data, precision, out):
    """``train.train`` for two epochs; the second epoch's img/s from history.csv (the first compiles)."""
    from vit_keras.training import train

    steps_per_epoch = args.steps
    config = train.train(data, out, model_name=args.model, image_size=args.image_size, batch_size=args.batch,
                         epochs=2, precision=precision, learning_rate=1e-4, warmup_epochs=0, verbose=2,
                         tensorboard=False, limit=args.batch * steps_per_epoch)
    with open(os.path.join(out, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    img_per_s = float(rows[-1]["img_per_s"])
    return dict(precision=precision, batch=args.batch, steps_per_epoch=config["steps_per_epoch"],
                replicas=config["replicas"], img_per_s=round(img_per_s, 1),
                first_epoch_img_per_s=round(float(rows[0]["img_per_s"]), 1), loss=[float(r["loss"]) for r in rows],
                **matmul_share(img_per_s, args.model, args.image_size, args.peak_tflops))


def compiled_step(args, precision, steps=None):
    """img/s of the trainer's compiled step (its model, optimizer and loss) on one fixed device-resident batch."""
    import jax
    import keras

    from vit_keras.training import train

    steps = steps or args.steps
    train.set_precision(precision)
    try:
        model = train.build_model_to_train(1000, 3, (args.image_size, args.image_size), model_name=args.model,
                                           image_size=args.image_size)
        schedule = train.WarmupCosine(1e-4, 10 ** 6)
        train.compile_model(model, schedule, precision, jit_compile=True)
        rng = np.random.default_rng(0)
        x = jax.device_put(rng.uniform(0, 255, (args.batch, args.image_size, args.image_size, 3)).astype("float32"))
        y = jax.device_put(np.eye(1000, dtype="float32")[rng.integers(0, 1000, args.batch)])
        first = model.train_on_batch(x, y, return_dict=True)["loss"]  # compiles
        model.train_on_batch(x, y)
        start = time.perf_counter()
        for _ in range(steps):
            loss = model.train_on_batch(x, y, return_dict=True)["loss"]
        loss = float(loss)  # waits for the last step
        img_per_s = args.batch * steps / (time.perf_counter() - start)
    finally:
        train.set_precision("float32")
    return dict(precision=precision, batch=args.batch, steps=steps, img_per_s=round(img_per_s, 1),
                first_loss=float(first), loss=loss, device=str(jax.devices()[0]),
                **matmul_share(img_per_s, args.model, args.image_size, args.peak_tflops))


def float16_probes():
    """Each part of a mixed_float16 ViT compiled alone under jit, forward and gradient (of its weights and its
    input: the backward pass has dots of its own), to find the one XLA rejects."""
    import keras

    from vit_keras.models.encoder import MultiHeadSelfAttention, TransformerBlock
    from vit_keras.models.vision_transformer import VisionTransformer

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        tokens = np.random.default_rng(0).normal(size=(8, 197, 64)).astype("float32")
        image = np.random.default_rng(1).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
        parts = [
            ("Dense (a matmul)", keras.layers.Dense(64), tokens, {}),
            ("Conv2D 16x16 stride 16 (the patch embedding)", keras.layers.Conv2D(64, 16, strides=16), image, {}),
            ("LayerNormalization", keras.layers.LayerNormalization(), tokens, {}),
            ("MultiHeadSelfAttention, its default path", MultiHeadSelfAttention(4), tokens, {}),
            ("explicit attention (softmax(q k^T))", MultiHeadSelfAttention(4), tokens,
             dict(return_attention_scores=True)),
            ("jax.nn.dot_product_attention via ops.dot_product_attention, float16 q, k, v", None, tokens, {}),
            ("TransformerBlock", TransformerBlock(4, 128), tokens, {}),
            ("VisionTransformer (2 blocks, 32 px)", VisionTransformer(image_size=32, patch_size=16, hidden_size=64,
                                                                        num_heads=4, mlp_dim=128, num_layers=2,
                                                                        num_classes=10), image, {}),
        ]
        return [probe(name, layer, x, kwargs) for name, layer, x, kwargs in parts]
    finally:
        keras.mixed_precision.set_global_policy(previous)


def probe(name, layer, x, kwargs):
    """Forward and gradient of one part; ``layer`` None: the bare fused attention op on float16 heads of ``x``."""
    import jax
    import jax.numpy as jnp
    from keras import ops

    if layer is None:
        trainable, non_trainable = [], []

        def outputs(trainable, x):
            heads = x.astype("float16").reshape(x.shape[0], x.shape[1], 4, -1)
            return ops.dot_product_attention(heads, heads, heads)
    else:
        if not layer.built:
            layer.build(x.shape)
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def outputs(trainable, x):
            out = layer.stateless_call(trainable, non_trainable, x, **kwargs)[0]
            return out[0] if isinstance(out, (tuple, list)) else out

    def loss(trainable, x):
        return jnp.sum(outputs(trainable, x).astype("float32"))

    row = dict(probe=name)
    for kind, compiled in (("forward", jax.jit(loss)), ("gradient", jax.jit(jax.grad(loss, argnums=(0, 1))))):
        try:
            jax.block_until_ready(compiled(trainable, x))
            row[kind] = "ok"
        except Exception as error:  # report every part: one failure must not hide which others fail
            row[kind] = error_text(error)
    return row


def check_float16(args, data, out):
    """Whether the trainer compiles and trains in mixed_float16, with the parts' probes either way."""
    try:
        result = dict(compiles=True, trainer=run_trainer(args, data, "mixed_float16", out))
    except Exception as error:
        traceback.print_exc()
        result = dict(compiles=False, error=error_text(error))
    return dict(result, probes=float16_probes())


def timm_child(args):
    """Run in a child process: timm's training img/s with autocast(bfloat16), eager and compiled."""
    import torch
    import torch.nn.functional as F

    try:
        import timm
    except ImportError as error:
        return dict(error=f"timm is not installed here ({error})")
    from vit_keras.inference.bench import TIMM_NAMES

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = timm.create_model(TIMM_NAMES[args.model], pretrained=False, num_classes=1000,
                              img_size=args.image_size).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)

    def measure(network):
        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = F.cross_entropy(network(images), labels, label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return loss

        for _ in range(3):  # warm-up (compiles, under torch.compile)
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        float(loss)
        if device == "cuda":
            torch.cuda.synchronize()
        img_per_s = args.batch * args.steps / (time.perf_counter() - start)
        return dict(img_per_s=round(img_per_s, 1), **matmul_share(img_per_s, args.model, args.image_size,
                                                                   args.peak_tflops))

    report = dict(torch=torch.__version__, timm=timm.__version__, device=device, autocast="bfloat16",
                  eager=measure(model))
    try:
        report["compiled"] = measure(torch.compile(model))
    except Exception as error:
        report["compiled"] = dict(error=error_text(error))
    return report


def run_timm(args):
    """timm's figures from a child process (before JAX starts here), or why there are none."""
    command = [sys.executable, os.path.abspath(__file__), "--timm-child", *sys.argv[1:]]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=args.timm_timeout,
                                env={**os.environ, "KERAS_BACKEND": "torch"})
    except subprocess.TimeoutExpired:
        return dict(error=f"timm did not finish in {args.timm_timeout} s")
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return dict(error=result.stderr.strip()[-2000:] or f"exit status {result.returncode}")
    return json.loads(lines[-1])


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="a tiny run on this CPU: vit_ti16 at 32, batch 8, 2 steps")
    parser.add_argument("--model", default="vit_b16", help="a plain named ViT (default vit_b16)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--steps", type=int, default=12, help="steps per timed epoch / timed steps")
    parser.add_argument("--data", default=None, help="a data spec for the trainer (default: a synthetic folder)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the card's bf16 matmul rate (0: unknown)")
    parser.add_argument("--checks", default="timm,trainer,step,float16")
    parser.add_argument("--timm-timeout", type=int, default=300)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--timm-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu:
        args.model, args.image_size, args.batch, args.steps, args.peak_tflops = "vit_ti16", 32, 8, 2, 0.0
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.timm_child:
        print(json.dumps(timm_child(args)))
        return 0
    checks = args.checks.split(",")
    report = dict(model=args.model, image_size=args.image_size, batch=args.batch, peak_tflops=args.peak_tflops)

    def record(key, value):
        report[key] = value
        print(key, json.dumps(value), flush=True)
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(report, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    if "timm" in checks:
        record("timm", run_timm(args))
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras

    record("environment", dict(backend=keras.backend.backend(), keras=keras.__version__, jax=jax.__version__,
                               devices=[str(d) for d in jax.devices()],
                               tensorflow_imported="tensorflow" in sys.modules))
    with tempfile.TemporaryDirectory() as work:
        data = args.data
        if data is None and {"trainer", "float16"} & set(checks):
            count = int(args.batch * args.steps / 0.9) + args.batch  # the folder's val part is 0.1 of it
            data = "folder:" + write_synthetic_folder(os.path.join(work, "data"), count, args.image_size)
        if "trainer" in checks:
            try:
                record("trainer", run_trainer(args, data, "mixed_bfloat16", os.path.join(work, "bf16")))
            except Exception as error:
                traceback.print_exc()
                record("trainer", dict(error=error_text(error)))
        if "step" in checks:
            try:
                record("step", compiled_step(args, "mixed_bfloat16"))
            except Exception as error:
                traceback.print_exc()
                record("step", dict(error=error_text(error)))
        if "float16" in checks:
            record("float16", check_float16(args, data, os.path.join(work, "f16")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
