"""Training img/s on this CPU under each Keras backend, side by side (prints figures; not a test).

    python benchmarks/train_backends.py                      # TensorFlow and JAX
    python benchmarks/train_backends.py --backends tensorflow,jax,torch

For each backend, a child process (Keras picks its backend once per process) measures:
- quick: the quick recipe through the real trainer (``train.train`` on Fashion-MNIST, its model, batch 128
  and input pipeline: tf.data under TensorFlow, NumPy batches elsewhere), the second epoch's img/s and CPU
  seconds as history.csv records them (the first compiles);
- vit_ti16: ViT-Ti/16 at 224, batch 32, the trainer's optimizer and loss (and, under TensorFlow, its two
  concurrent micro-batches), timed over ``--steps`` steps after 3 warm-up steps.
The figures are indicative when other work shares the CPU: the load average is printed with them.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def quick_recipe(limit):
    from vit_keras.training import train

    with tempfile.TemporaryDirectory() as out:
        config = train.train("fashion_mnist", out, limit=limit, epochs=2, verbose=0, tensorboard=False)
        with open(os.path.join(out, "history.csv")) as f:
            last = list(csv.DictReader(f))[-1]
    return dict(batch=config["batch_size"], steps_per_epoch=config["steps_per_epoch"],
                micro_batches=config["micro_batches"], img_per_s=round(float(last["img_per_s"]), 1),
                cpu_s=round(float(last["cpu_s"]), 1))


def vit_ti(steps, micro_batches, batch=32, warmup=3):
    import keras
    import numpy as np

    from vit_keras.training import train

    model = train.build_model_to_train(1000, 3, (224, 224), model_name="vit_ti16", image_size=224)
    micro = micro_batches if keras.backend.backend() == "tensorflow" else 1
    train.compile_model(model, train.WarmupCosine(1e-3, 10_000, 10), jit_compile=micro == 1 and
                        keras.backend.backend() != "torch")
    if micro > 1:
        from vit_keras.training.microbatch import enable_micro_batches

        enable_micro_batches(model, micro)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (batch * (warmup + steps), 224, 224, 3)).astype("float32")
    y = np.eye(1000, dtype="float32")[rng.integers(0, 1000, len(x))]

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if step == warmup - 1:
                self.start = time.perf_counter(), sum(os.times()[:2])
            elif step == warmup + steps - 1:
                self.wall, self.cpu = (time.perf_counter() - self.start[0], sum(os.times()[:2]) - self.start[1])

    clock = Clock()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock])
    return dict(batch=batch, steps=steps, micro_batches=micro, img_per_s=round(batch * steps / clock.wall, 2),
                cpu_s=round(clock.cpu, 1))


def child(args):
    import keras

    from vit_keras.apps.allocator import reexec_with_tcmalloc

    reexec_with_tcmalloc()  # as the `vit-keras` CLI runs
    load = os.getloadavg()
    result = dict(backend=keras.backend.backend(), quick=quick_recipe(args.limit),
                  vit_ti16=vit_ti(args.steps, args.micro_batches))
    print(json.dumps(dict(result, loadavg_before=load, loadavg_after=os.getloadavg())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tensorflow,jax")
    parser.add_argument("--limit", type=int, default=4096, help="training images of the quick run (batch 128)")
    parser.add_argument("--steps", type=int, default=8, help="timed ViT-Ti/16 steps")
    parser.add_argument("--micro-batches", type=int, default=2, help="TensorFlow's, as the trainer's default")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    rows = []
    for backend in args.backends.split(","):
        command = [sys.executable, os.path.abspath(__file__), "--child", "--limit", str(args.limit), "--steps",
                   str(args.steps), "--micro-batches", str(args.micro_batches)]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": backend})
        if result.returncode != 0:
            print(f"{backend}: failed\n{result.stderr[-3000:]}")
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'backend':<12}{'quick img/s':>12}{'(cpu s)':>9}{'ViT-Ti/16 224 b32 img/s':>26}{'(cpu s)':>9}  load")
    for row in rows:
        q, v = row["quick"], row["vit_ti16"]
        print(f"{row['backend']:<12}{q['img_per_s']:>12}{q['cpu_s']:>9}{v['img_per_s']:>26}{v['cpu_s']:>9}  "
              f"{row['loadavg_before'][0]:.1f}->{row['loadavg_after'][0]:.1f}")


if __name__ == "__main__":
    main()
