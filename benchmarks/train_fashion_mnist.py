"""Training benchmark (prints figures; not a test).

  python benchmarks/train_fashion_mnist.py --recipe quick          # the default recipe: target >= 92% in <= 10 min
  python benchmarks/train_fashion_mnist.py --recipe long           # issue 22's target: >= 93% in <= 60 min
  python benchmarks/train_fashion_mnist.py --vit-ti                # ViT-Ti/16 at 224, batch 32: training img/s
  python benchmarks/train_fashion_mnist.py --step-rate             # the quick recipe's step in GFLOP/s vs GEMM rates
  python benchmarks/train_fashion_mnist.py --vit-ti --micro-batches 1   # the same as one XLA program per step
  /work/.venv-ref/bin/python benchmarks/timm_train_throughput.py   # timm's figure on the same machine

Runs under tcmalloc, as the `vit-keras` CLI does (apps/allocator.py). Prints the per-epoch curve, test
accuracy, wall and CPU seconds (loading, building and compiling included), the seconds of `fit` alone and the
images/s they give, and the load average before and after: a load above the core count means
the figures were measured under contention. The CPU-time figure (img per CPU-second x cores) estimates
the rate on a quiet machine.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from vit_keras.constants import PRECISIONS, RECIPES  # noqa: E402  (after the path)


def cpu_seconds():
    usage = os.times()
    return usage.user + usage.system


def train_recipe(args):
    from vit_keras.training import train
    from vit_keras.data.datasets import load_arrays
    from vit_keras.training.evaluation import evaluate_arrays
    import keras

    import tempfile

    # A fresh folder each time: in a finished run's folder train() returns at once, and in an interrupted
    # one's it resumes, so the figures would be old or partial.
    out = args.out or tempfile.mkdtemp(prefix=f"vit_keras_bench_{args.recipe}_")
    if os.path.exists(os.path.join(out, "config.json")):
        sys.exit(f"--out {out} already holds a run; give an empty folder so the figures are this run's.")
    load_before, cpu_before, start = os.getloadavg(), cpu_seconds(), time.perf_counter()
    config = train.train("fashion_mnist", out, recipe=args.recipe, epochs=args.epochs, batch_size=args.batch_size,
                         precision=args.precision, verbose=2, tensorboard=False, jit_compile=not args.no_jit)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_before
    model = keras.saving.load_model(os.path.join(out, "model.keras"), compile=False)
    images, labels, names = load_arrays("fashion_mnist", "test")
    result = evaluate_arrays(model, images, labels, names)
    with open(os.path.join(out, "history.csv")) as f:
        curve = f.read()
    figures = dict(recipe=args.recipe, params=model.count_params(), epochs=config["epochs"],
                   batch_size=config["batch_size"], test_accuracy=round(result["accuracy"], 4),
                   train_wall_s=round(wall, 1), train_cpu_s=round(cpu, 1), fit_s=config["fit_seconds_last_session"],
                   fit_img_per_s=round(config["epochs"] * config["train_examples"] / config["fit_seconds_last_session"], 1),
                   loadavg_before=load_before, loadavg_after=os.getloadavg(), cores=os.cpu_count())
    print("history.csv:\n" + curve)
    print(json.dumps(figures))


def vit_ti_throughput(args):
    """fit steps/s of ViT-Ti/16 at 224, batch 32, timed after 3 warm-up steps by a callback (no data copy timed)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import vit_keras

    from vit_keras.training.optimizer import set_precision

    keras.utils.set_random_seed(0)
    set_precision(args.precision)  # before the model is built: its layers take the policy then
    model = vit_keras.create_model("vit_ti16", image_size=224, num_classes=1000)
    micro = 1 if args.no_jit else args.micro_batches
    model.compile(optimizer=keras.optimizers.AdamW(1e-3, global_clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=not args.no_jit and micro == 1)
    if micro > 1:
        vit_keras.enable_micro_batches(model, micro)
    batch, warmup, steps = 32, 3, args.steps
    x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    y = np.random.default_rng(1).integers(0, 1000, batch)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if step == warmup - 1:
                self.start, self.cpu = time.perf_counter(), cpu_seconds()
            elif step == warmup + steps - 1:
                self.wall, self.cpu = time.perf_counter() - self.start, cpu_seconds() - self.cpu

    clock, load_before = Clock(), os.getloadavg()
    model.fit(data, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[clock])
    n = batch * steps
    print(json.dumps(dict(model="vit_ti16", image_size=224, precision=args.precision, batch_size=batch, steps=steps,
                          jit=not args.no_jit,
                          micro_batches=micro,
                          img_per_s=round(n / clock.wall, 2), img_per_cpu_s_x_cores=round(n / clock.cpu * os.cpu_count(), 2),
                          loadavg_before=load_before, loadavg_after=os.getloadavg(), cores=os.cpu_count())))


def quick_step_rate(args):
    """The quick recipe's training step (its model, batch, XLA micro-batches) in img/s and GFLOP/s, beside the
    rate of one big GEMM and of a GEMM the shape of its qkv projection: how much faster kernels could make it."""
    import keras
    import numpy as np
    import tensorflow as tf

    from vit_keras.training import train
    from vit_keras.inference.bench import matmul_peak_gflops, timed
    from vit_keras.training.microbatch import enable_micro_batches

    recipe = train.RECIPES["quick"]
    batch, micro = recipe["batch_size"], 2
    model = train.build_model_to_train(10, 1, (28, 28))
    train.compile_model(model, train.WarmupCosine(4e-3, 10_000, 10), jit_compile=False, steps_per_execution=8)
    enable_micro_batches(model, micro)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (batch * 8, *model.input_shape[1:])).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 10, batch * 8), 10)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat().prefetch(4)
    steps = args.steps * 8
    seconds = timed(lambda: model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0), warmup=1, repeats=3)
    img_per_s = steps * batch / seconds

    cfg = model.get_config()
    d, m, layers = cfg["hidden_size"], cfg["mlp_dim"], cfg["num_layers"]
    side, t = cfg["image_size"][0], (cfg["image_size"][0] // cfg["patch_size"]) ** 2  # GAP: no class token
    stem, width = 0, 1
    for i, (conv, _) in enumerate(model.stem.blocks):  # 3x3 stride-2 convs, then the 1x1 patch projection
        width = conv.kernel.shape[-1]
        stem += 2 * (side // 2 ** (i + 1)) ** 2 * 9 * conv.kernel.shape[-2] * width
    stem += 2 * t * width * d
    block = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m
    train_flops = 3 * (stem + layers * block)  # backward ~ twice forward
    qkv = tf.random.normal((batch * t, d)), tf.random.normal((d, 3 * d))
    qkv_step = tf.function(lambda: tf.reduce_sum(tf.matmul(*qkv)))
    qkv_gflops = 2 * batch * t * d * 3 * d / timed(lambda: [qkv_step() for _ in range(50)][-1].numpy()) * 50 / 1e9
    peak = max(matmul_peak_gflops(2048, 5, concurrent) for concurrent in (1, 2))
    print(json.dumps(dict(params=model.count_params(), batch_size=batch, micro_batches=micro,
                          img_per_s=round(img_per_s), train_mflop_per_img=round(train_flops / 1e6, 1),
                          step_gflops=round(img_per_s * train_flops / 1e9, 1),
                          gemm_2048_gflops=round(peak, 1), gemm_qkv_shape_gflops=round(qkv_gflops, 1),
                          loadavg=os.getloadavg(), cores=os.cpu_count())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=RECIPES, default="quick")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--precision", default="float32", choices=PRECISIONS,
                        help="the recipe's and --vit-ti's Keras dtype policy (--step-rate measures float32 only)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument("--vit-ti", action="store_true", help="ViT-Ti/16 training throughput instead")
    parser.add_argument("--step-rate", action="store_true", help="the quick recipe's step rate against GEMM rates")
    parser.add_argument("--steps", type=int, default=8, help="timed steps for --vit-ti (x8 for --step-rate)")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="--vit-ti: concurrent micro-batches per step (vit_keras.training.microbatch); 1: one XLA step")
    args = parser.parse_args()
    from vit_keras.apps.allocator import reexec_with_tcmalloc

    reexec_with_tcmalloc()  # as the `vit-keras` CLI runs (VIT_KERAS_TCMALLOC=0 measures without)
    if args.step_rate and args.precision != "float32":
        parser.error("--step-rate measures the float32 step against float32 GEMMs; leave --precision out")
    if args.vit_ti:
        vit_ti_throughput(args)
    elif args.step_rate:
        quick_step_rate(args)
    else:
        train_recipe(args)
