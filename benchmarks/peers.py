"""Ours against the runtimes a user would pick instead for CPU inference, on the same models, weights and CPU, in
one process tree: images/s at batch 16, 224 px, the ratio to the best peer, and each figure as a share of this
machine's measured float32 and bfloat16 GEMM peaks.

    .venv/bin/python benchmarks/peers.py --peers-python /work/.venv-ref/bin/python [--real /work/real]
        [--models vit_ti16 vit_s16 vit_b16] [--repeats 5]

Ours: ``vit_keras.predict`` called repeatedly on batches of 16 in float32, bfloat16 and int8 (its first 256
images check the lower precision against float32; a precision refused on this CPU or fallen back is marked, on
the timing batches and on the photos).
Peers (benchmarks/peers_reference.py, in --peers-python: torch, timm, onnx, onnxruntime, openvino): timm eager,
torch.compile, ONNX Runtime float32 and dynamic int8, OpenVINO float32 and its default (bfloat16 where the CPU
has the units). The peers of a model wait compiled in their own process while ours compile; then each of
--repeats rounds times one batch through every path, theirs and ours, in turn (a shared 2-core VM drifts by
10-30% over minutes: paths timed one after the other do not compare). The median round counts; the spread
column is (slowest - fastest) / median. Ours run the weights the peers wrote. Random weights,
except ViT-Ti/16 with --real (the real ImageNet ViT-Ti/16 of ../shared/fixtures/real_imagenet.py): every path's
top-1 agreement with its own float32 on the 1,000 photos is printed too. Set up the peers' venv with
    python3.11 -m venv /work/.venv-ref && /work/.venv-ref/bin/pip install torch==2.14.1 torchvision==0.29.1 \\
        timm onnx onnxruntime==1.31.1 openvino==2026.4.1
"""

import argparse
import functools
import os
import re
import statistics
import sys
import tempfile
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from vit_keras.constants import BENCH_MODELS, INFERENCE_PRECISIONS  # noqa: E402
from vit_keras.cpu import cpu_features  # noqa: E402
from vit_keras.inference.bench import TIMM_NAMES, timed, vit_flops  # noqa: E402
from vit_keras.inference.served import Served, in_turns  # noqa: E402

PEERS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers_reference.py")


def our_paths(name, weights, photos=None):
    """``vit_keras.predict`` on batches of 16 in each precision, ready to time: ({label: a function returning the
    seconds of one call}, {label: what ran}, {precision: (top-1 agreement with our float32 on ``photos``, what ran
    on them)}, our float32's top-1 classes of ``photos``).

    The photos run first on their own model, so its check meets real photos (what ran on them is in the agreement
    row's label); the timed paths run on a fresh model, called until each lower precision's check has settled.
    Where the check fell back, the twin alone is a path too."""
    import warnings

    import keras

    import vit_keras
    from vit_keras.inference.precision import AGREEMENTS, CHECK_IMAGES, resolve, twin
    from vit_keras.inference.predict import predict_function

    def what_ran(model, precision, caught):
        checked = AGREEMENTS.get(model, {}).get(precision)
        if precision != "float32" and checked is None:
            why = str(caught[0].message).partition("here: ")[2].partition("; using")[0] if caught else ""
            return Ran("float32", "refused", re.sub(r" [(][^)]*[)]", "", why))
        return Ran("float32", "fell back") if checked is not None and not checked.kept else Ran(precision)

    def timer(run):  # the seconds of one call
        return lambda: timed(lambda: np.asarray(run()), warmup=0, repeats=1)

    keras.backend.clear_session()
    agreement, reference = {}, None
    if photos is not None:  # normalized as the peers normalize them
        model = vit_keras.create_model(name, weights=weights, include_preprocessing=False)
        photos = photos.astype("float32") / 127.5 - 1.0
        reference = vit_keras.predict(model, photos, batch_size=16).argmax(-1)
        for precision in INFERENCE_PRECISIONS:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                top1 = vit_keras.predict(model, photos, batch_size=16, precision=precision).argmax(-1)
            agreement[precision] = (float(np.mean(top1 == reference)), what_ran(model, precision, caught))
    model = vit_keras.create_model(name, weights=weights, include_preprocessing=False)
    batch = np.asarray(photos[:16] if photos is not None else
                       np.random.default_rng(0).normal(size=(16, 224, 224, 3)), "float32")
    paths, ran = {}, {}
    for precision in INFERENCE_PRECISIONS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            for _ in range(CHECK_IMAGES // 16 + 2):  # the check settles first: then the path runs alone
                vit_keras.predict(model, batch, batch_size=16, precision=precision)
        label = f"vit_keras.predict {precision}"
        ran[label] = what_ran(model, precision, caught)
        paths[label] = timer(lambda p=precision: vit_keras.predict(model, batch, batch_size=16, precision=p))
        if ran[label].note == "fell back":  # and what the twin itself runs at
            forward = predict_function(twin(model, precision), 4, resolve(precision)[1])
            forward(batch)
            paths[label + " twin alone"] = timer(lambda f=forward: f(batch))
            ran[label + " twin alone"] = Ran(precision, "not checked")
    return paths, ran, agreement, reference


class Ran(typing.NamedTuple):
    """What one of our paths computed in, ``precision``, and ``note`` where that is not what was asked: "refused"
    (the CPU lacks the units; ``reason`` says which), "fell back" (its agreement check failed) or "not checked" (a
    fallen-back twin, timed alone)."""
    precision: str
    note: str = ""
    reason: str = ""

    def __str__(self):
        if self.note == "refused":
            return f"refused, ran {self.precision}" + (f": {self.reason}" if self.reason else "")
        if self.note == "fell back":
            return f"fell back to {self.precision}"
        return self.note or self.precision


def share(rate, gflops, peak):
    return f"{100 * rate * gflops / peak:.0f}%" if peak else "-"


FLOAT32_PEERS = ("timm eager", "torch.compile", "ONNX Runtime float32", "OpenVINO float32")


def measure(args, name, photos, scratch):
    """(the peers' ready report, {label: [seconds of each round]}, what ours ran, agreement, our top-1) of a model."""
    out = os.path.join(scratch, name)
    os.makedirs(out)
    real = photos is not None and name == "vit_ti16"
    photos_path = weights = None
    if real:
        photos_path, weights = os.path.join(scratch, "photos.npy"), os.path.join(args.real, "vit_ti16_in1k.safetensors")
        np.save(photos_path, photos)
    command = [args.peers_python, PEERS_SCRIPT, TIMM_NAMES[name], "--out", out]
    command += ["--weights", weights, "--photos", photos_path] if real else []
    theirs = Served(command)
    try:
        paths, ran, agreement, reference = our_paths(name, os.path.join(out, "model.safetensors"),
                                                     photos if real else None)
        paths = {**{peer: functools.partial(theirs.seconds, peer) for peer in theirs.info["peers"]}, **paths}
        times = in_turns(paths, args.repeats, pause=0.3, warm_call=True)
    finally:
        theirs.close()
    return theirs.info, times, ran, agreement, reference


def print_table(name, info, times, ran, agreement, reference, peaks):
    gflops = vit_flops(name) / 1e9
    rates = {label: 16 / statistics.median(t) for label, t in times.items()}
    default = info["openvino_default_precision"]  # "<Type: 'float32'>" where the CPU has no bf16 units
    float32_peers = [*FLOAT32_PEERS, *(["OpenVINO default"] if "float32" in default or "f32" in default else [])]
    best_peer = max(info["peers"], key=rates.get)
    best_float32 = max(float32_peers, key=rates.get)
    rounds = len(next(iter(times.values())))
    print(f"\n{name}, batch 16, 224 px, images/s (median of {rounds} rounds, each path in turn a round, its second "
          f"call); best peer: {best_peer} {rates[best_peer]:.1f}; best float32 peer: {best_float32} "
          f"{rates[best_float32]:.1f}")
    print("| path | img/s | spread | x best peer | x best float32 peer | % fp32 peak | % bf16 peak | "
          "top-1 agreement with float32 |")
    print("|---|---|---|---|---|---|---|---|")
    for label, rate in rates.items():
        spread = (max(times[label]) - min(times[label])) / statistics.median(times[label])
        if label in info["peers"]:
            agree = info.get("agreement", {}).get(label)
            agree = "-" if agree is None else f"{100 * agree:.1f}%"
        else:
            precision = label.split()[1]
            agree, on_photos = agreement.get(precision, (None, None)) if "twin" not in label else (None, None)
            if agree is None:
                agree = "-"
            else:  # a refusal's reason is already in the path's label
                agree = f"{100 * agree:.1f}% (ran {on_photos.precision if on_photos.note == 'refused' else on_photos})"
            label = f"{label} ({ran[label]})"
        print(f"| {label} | {rate:.1f} | {100 * spread:.0f}% | {rate / rates[best_peer]:.2f} | "
              f"{rate / rates[best_float32]:.2f} | {share(rate, gflops, peaks[0])} | {share(rate, gflops, peaks[1])} "
              f"| {agree} |")
    if reference is not None and "top1" in info:
        print(f"(our float32 and timm's agree on {100 * np.mean(reference == np.array(info['top1'])):.1f}% "
              "of the photos)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers-python", required=True, help="an interpreter with torch, timm, onnxruntime, openvino")
    parser.add_argument("--real", default=None, help="the real ViT-Ti/16 fixture folder (weights and photos)")
    parser.add_argument("--models", nargs="+", default=list(BENCH_MODELS), choices=list(BENCH_MODELS))
    parser.add_argument("--repeats", type=int, default=7, help="rounds; each times one batch through every path")
    args = parser.parse_args(argv)
    from vit_keras.inference.bench import matmul_peak_gflops

    cpu = cpu_features()
    print(cpu.describe())
    fp32_peak = max(matmul_peak_gflops(size, reps, n) for size, reps in ((1024, 20), (2048, 5)) for n in (1, 2))
    bf16_peak = max(matmul_peak_gflops(2048, 5, n, "bfloat16") for n in (1, 2)) if cpu.bf16 else None
    print(f"GEMM peaks (TensorFlow, measured now): float32 {fp32_peak:.0f} GFLOPS, "
          f"bfloat16 {f'{bf16_peak:.0f} GFLOPS' if bf16_peak else '- (no bf16 units)'}")
    photos = None
    if args.real:
        from real_vit_int8 import load_photos

        photos = load_photos(args.real)[0]
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            info, times, ran, agreement, reference = measure(args, name, photos, scratch)
            print(f"{name}: measured ({info['torch']}, {info['threads']} threads; OpenVINO's default precision "
                  f"{info['openvino_default_precision']})", flush=True)
            print_table(name, info, times, ran, agreement, reference, (fp32_peak, bf16_peak))


if __name__ == "__main__":
    main()
