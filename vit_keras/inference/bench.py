"""Inference throughput of the paper's models, and how close it comes to the machine's matmul peak.

    vit-keras bench [--timm-python /path/to/python-with-timm]

Prints images/s for ViT-Ti/16, S/16 and B/16 at 224, batch 16: float32 with XLA on and off, bfloat16 and
int8 as ``vit_keras.predict`` runs them where this CPU computes them fast, the fraction of the measured fp32
and bf16 matmul peaks, and timm's figures measured in the same run by a child process (``--timm-python``: an
interpreter that has timm; by default this one), timed in turns with ours (``served``).
"""

import functools
import statistics
import sys
import time
from pathlib import Path

from vit_keras.constants import BENCH_MODELS, INFERENCE_PRECISIONS
from vit_keras.cpu import cpu_features
from vit_keras.factory import create_model
from vit_keras.inference.precision import resolve, twin
from vit_keras.inference.predict import predict_function
from vit_keras.inference.served import Served, in_turns
from vit_keras.models.configs import MODELS, VARIANTS
from vit_keras.validation import check_choice

DEFAULT_MODELS = BENCH_MODELS
TIMM_NAMES = {"vit_ti16": "vit_tiny_patch16_224", "vit_s16": "vit_small_patch16_224",
              "vit_b16": "vit_base_patch16_224", "vit_s32": "vit_small_patch32_224",
              "vit_b32": "vit_base_patch32_224"}


def vit_flops(name, image_size=224, num_classes=1000):
    """Multiply-add FLOPs (x2) that one image costs a plain ViT: the matmuls, which are ~all of it.

    The last block computes qkv for all T tokens but the rest for the class token alone (``query_tokens=1``).
    """
    variant, patch, stem = MODELS[name]
    if stem:
        raise ValueError(f"vit_flops counts plain ViTs only; got the hybrid {name!r}.")
    cfg = VARIANTS[variant]
    d, m, layers = cfg["hidden_size"], cfg["mlp_dim"], cfg["num_layers"]
    n = (image_size // patch) ** 2
    t = n + 1

    def block(queries):
        return 2 * t * d * 3 * d + 2 * 2 * queries * t * d + 2 * queries * d * d + 2 * 2 * queries * d * m

    return 2 * n * patch * patch * 3 * d + (layers - 1) * block(t) + block(1) + 2 * d * num_classes


def timed(fn, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak_gflops(size=1024, repeats=20, concurrent=1, dtype="float32", jit_compile=False):
    """Sustained GEMM rate of this machine through TensorFlow (the ceiling for a ViT), in ``dtype``.

    ``concurrent`` independent GEMMs per call run side by side in the inter-op pool, as the micro-batched
    paths run theirs: TensorFlow's one GEMM on two threads leaves part of the second core unused.
    ``jit_compile``: XLA's own dot instead of TensorFlow's kernel (oneDNN on x86, AMX and AVX512_BF16 included).
    """
    import tensorflow as tf

    pairs = [(tf.cast(tf.random.normal((size, size)), dtype), tf.cast(tf.random.normal((size, size)), dtype))
             for _ in range(concurrent)]
    step = tf.function(lambda: tf.add_n([tf.reduce_sum(tf.cast(tf.matmul(a, b), "float32")) for a, b in pairs]),
                       jit_compile=jit_compile)
    seconds = timed(lambda: [step() for _ in range(repeats)][-1].numpy()) / repeats
    return concurrent * 2 * size ** 3 / seconds / 1e9


# column -> (precision, jit_compile, micro-batches). The lower precisions run as ``predict`` runs them once their
# first images have been checked (``predict_function``'s twin and compiler); their agreement on real photos is
# benchmarks/peers.py's.
MODES = {"xla": ("float32", True, 1), "no-xla": ("float32", False, 1), "micro": ("float32", True, 4),
         "bfloat16": ("bfloat16", False, 4), "int8": ("int8", True, 4)}


def keras_throughput(name, batch, image_size, repeats, precisions=INFERENCE_PRECISIONS, others=None):
    """Images/s of ``name`` in each of MODES whose precision is in ``precisions`` and runs fast on this CPU, and of
    ``others`` ({label: a function returning the seconds of one batch elsewhere}): all compiled first, then timed
    in turns, a call of each a round (a shared CPU drifts)."""
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    model = create_model(name, image_size=image_size, include_preprocessing=False)  # timm's forward has none
    images = tf.random.normal((batch, image_size, image_size, 3))
    paths = {}
    for mode, (precision, jit, micro) in MODES.items():
        if precision not in precisions:
            continue
        runs_as, jit = resolve(precision, jit)
        if runs_as == precision:  # else refused here, with a warning
            forward = predict_function(twin(model, precision), micro, jit)
            forward(images).numpy()
            paths[mode] = lambda forward=forward: timed(lambda: forward(images).numpy(), warmup=0, repeats=1)
    paths.update(others or {})
    return {label: batch / statistics.median(t) for label, t in in_turns(paths, repeats).items()}


def timm_server(python, names, batch, image_size):
    """timm's models, compiled and warm in ``python`` (or this interpreter), served by timm_reference.py
    (``Served``); None, with the reason printed, where it cannot start (no torch or timm there).

    The script is run by path, so ``python`` needs torch and timm but not vit_keras."""
    script = Path(__file__).with_name("timm_reference.py")
    names = [TIMM_NAMES[n] for n in names if n in TIMM_NAMES]
    try:
        return Served([python or sys.executable, str(script), "--batch-size", str(batch), "--image-size",
                       str(image_size), *names])
    except RuntimeError as error:
        print(f"(timm not measured: {error})")
        return None


def main(names=DEFAULT_MODELS, batch=16, image_size=224, repeats=5, timm_python=None,
         precisions=INFERENCE_PRECISIONS):
    unsupported = [name for name in names if MODELS.get(name, (None, None, "unknown"))[2]]
    if unsupported:  # before minutes of timing: the %-of-peak column counts plain ViTs' matmuls only
        plain = ", ".join(name for name, (_, _, stem) in MODELS.items() if not stem)
        raise ValueError(f"`models` {unsupported} are not plain ViT names; bench measures {plain}.")
    for precision in precisions:
        check_choice(precision, "precisions", INFERENCE_PRECISIONS)
    # the best of two GEMM sizes, alone and two at a time: one run swings by 20% on a small shared CPU
    peak = max(matmul_peak_gflops(size, repeats, concurrent) for size, repeats in ((1024, 20), (2048, 5))
               for concurrent in (1, 2))
    print(cpu_features().describe())
    print(f"fp32 matmul peak (TensorFlow GEMM, best of 1024^3 and 2048^3, one or two at a time): {peak:.1f} GFLOPS")
    bf16_peak = None
    if cpu_features().bf16:  # the bf16 units' ceiling, and whether XLA's own dot reaches it
        bf16 = {jit: max(matmul_peak_gflops(2048, 5, concurrent, "bfloat16", jit) for concurrent in (1, 2))
                for jit in (False, True)}
        bf16_peak = bf16[False]
        print(f"bf16 matmul peak (2048^3): TensorFlow's kernel {bf16[False]:.1f} GFLOPS, XLA's dot {bf16[True]:.1f}")
    timm = timm_server(timm_python, names, batch, image_size)
    ours, theirs = {}, {}
    try:
        for name in names:
            others = {"timm": functools.partial(timm.seconds, TIMM_NAMES[name])} if timm and name in TIMM_NAMES else {}
            ours[name] = keras_throughput(name, batch, image_size, repeats, precisions, others)
            if "timm" in ours[name]:
                theirs[name] = ours[name].pop("timm")
    finally:
        if timm:
            timm.close()
    print(f"\ninference img/s, batch {batch}, {image_size}x{image_size} (x4 micro: vit_keras.predict_function, 4 "
          "concurrent micro-batches; bfloat16 and int8: vit_keras.predict's twins, '-' where not asked for or not "
          "fast on this CPU)")
    print(f"{'model':10} {'XLA':>7} {'no-XLA':>7} {'XLA x4 micro':>13} {'bfloat16':>9} {'int8':>7} "
          f"{'fp32 % of peak':>15} {'bf16 % of peak':>15} {'timm':>7} {'best/timm':>10}")
    for name in names:
        rates = ours[name]
        cells = [f"{rates[mode]:{width}.1f}" if mode in rates else f"{'-':>{width}}"
                 for mode, width in (("xla", 7), ("no-xla", 7), ("micro", 13), ("bfloat16", 9), ("int8", 7))]
        gflops = vit_flops(name, image_size) / 1e9
        float_best = max((rates[m] for m in ("xla", "no-xla", "micro") if m in rates), default=None)
        shares = [f"{100 * rate * gflops / ceiling:14.0f}%" if rate and ceiling else f"{'-':>15}"
                  for rate, ceiling in ((float_best, peak), (rates.get("bfloat16"), bf16_peak))]
        timm, best = theirs.get(name), max(rates.values())
        timm_text = f"{timm:7.1f} {best / timm:10.2f}" if timm else f"{'-':>7} {'-':>10}"
        print(f"{name:10} {' '.join(cells)} {' '.join(shares)} {timm_text}")
    return ours, theirs
