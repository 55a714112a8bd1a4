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
has the units). Each model is measured by the peers, then by us, on the weights the peers wrote. Random weights,
except ViT-Ti/16 with --real (the real ImageNet ViT-Ti/16 of ../shared/fixtures/real_imagenet.py): every path's
top-1 agreement with its own float32 on the 1,000 photos is printed too. Set up the peers' venv with
    python3.11 -m venv /work/.venv-ref && /work/.venv-ref/bin/pip install torch==2.14.1 torchvision==0.29.1 \\
        timm onnx onnxruntime==1.31.1 openvino==2026.4.1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from vit_keras.constants import BENCH_MODELS, INFERENCE_PRECISIONS  # noqa: E402
from vit_keras.cpu import cpu_features  # noqa: E402
from vit_keras.inference.bench import TIMM_NAMES  # noqa: E402

PEERS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers_reference.py")


def peers(python, name, out, repeats, weights=None, photos=None):
    command = [python, PEERS_SCRIPT, TIMM_NAMES[name], "--out", out, "--repeats", str(repeats)]
    command += ["--weights", weights] if weights else []
    command += ["--photos", photos] if photos else []
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the peers failed on {name}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def ours(name, weights, repeats, photos=None):
    """{precision: images/s through vit_keras.predict, batches of 16}, {precision: what ran}, {precision: top-1
    agreement with our float32 on ``photos``}, and our float32's top-1 classes of ``photos``.

    The photos run first on their own model, so its check meets real photos (what ran on them is in the agreement
    row's label); the timing runs on a fresh model, fed the first 64 photos (else random images) over and over,
    timed once its check has settled. Where the check fell back, the twin alone is timed too."""
    import warnings

    import keras

    import vit_keras
    from vit_keras.inference.precision import AGREEMENTS, CHECK_IMAGES, resolve, twin
    from vit_keras.inference.predict import predict_function

    def what_ran(model, precision, caught):
        checked = AGREEMENTS.get(model, {}).get(precision)
        if precision != "float32" and checked is None:
            return "refused: " + str(caught[0].message)[:60] if caught else "refused"
        return "fell back to float32" if checked is not None and not checked.kept else precision

    keras.backend.clear_session()
    rates, ran, agreement, reference = {}, {}, {}, None
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
    batches = (photos if photos is not None else np.random.default_rng(0).normal(size=(64, 224, 224, 3)))
    batches = [np.asarray(batches[i:i + 16], "float32") for i in range(0, 64, 16)]
    for precision in INFERENCE_PRECISIONS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            for i in range(CHECK_IMAGES // 16 + 2):  # the check settles first: then the path runs alone
                vit_keras.predict(model, batches[i % len(batches)], batch_size=16, precision=precision)
            times = []
            for i in range(repeats):
                start = time.perf_counter()
                vit_keras.predict(model, batches[i % len(batches)], batch_size=16, precision=precision)
                times.append(time.perf_counter() - start)
        rates[precision] = 16 / statistics.median(times)
        ran[precision] = what_ran(model, precision, caught)
        if ran[precision] == "fell back to float32":  # and what the twin itself runs at
            forward = predict_function(twin(model, precision), 4, resolve(precision)[1])
            times = []
            for i in range(repeats + 2):
                start = time.perf_counter()
                np.asarray(forward(batches[i % len(batches)]))
                times.append(time.perf_counter() - start)
            rates[precision + " twin alone"] = 16 / statistics.median(times[2:])
            ran[precision + " twin alone"] = "not checked"
    return rates, ran, agreement, reference


def share(rate, gflops, peak):
    return f"{100 * rate * gflops / peak:.0f}%" if peak else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers-python", required=True, help="an interpreter with torch, timm, onnxruntime, openvino")
    parser.add_argument("--real", default=None, help="the real ViT-Ti/16 fixture folder (weights and photos)")
    parser.add_argument("--models", nargs="+", default=list(BENCH_MODELS), choices=list(BENCH_MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from vit_keras.inference.bench import matmul_peak_gflops, vit_flops

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
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            out = os.path.join(scratch, name)
            os.makedirs(out)
            real = photos is not None and name == "vit_ti16"
            photos_path = None
            if real:
                photos_path = os.path.join(scratch, "photos.npy")
                np.save(photos_path, photos)
            theirs = peers(args.peers_python, name, out, args.repeats,
                           os.path.join(args.real, "vit_ti16_in1k.safetensors") if real else None, photos_path)
            rates, ran, agreement, reference = ours(name, os.path.join(out, "model.safetensors"), args.repeats,
                                                    photos if real else None)
            rows.append((name, theirs, rates, ran, agreement, reference))
            print(f"{name}: measured ({theirs['torch']}, {theirs['threads']} threads; OpenVINO's default precision "
                  f"{theirs['openvino_default_precision']})", flush=True)
    for name, theirs, rates, ran, agreement, reference in rows:
        gflops = vit_flops(name) / 1e9
        best_peer, best_rate = max(theirs["rates"].items(), key=lambda item: item[1])
        print(f"\n{name}, batch 16, 224 px, images/s (share of the float32 / bfloat16 GEMM peak); best peer: "
              f"{best_peer} {best_rate:.1f}")
        print(f"| path | img/s | x best peer | % fp32 peak | % bf16 peak | top-1 agreement with float32 |")
        print("|---|---|---|---|---|---|")
        for peer, rate in theirs["rates"].items():
            agree = theirs.get("agreement", {}).get(peer)
            print(f"| {peer} | {rate:.1f} | {rate / best_rate:.2f} | {share(rate, gflops, fp32_peak)} | "
                  f"{share(rate, gflops, bf16_peak)} | {'-' if agree is None else f'{100 * agree:.1f}%'} |")
        for precision, rate in rates.items():
            agree, on_photos = agreement.get(precision, (None, None))
            print(f"| vit_keras.predict {precision} ({ran[precision]}) | {rate:.1f} | {rate / best_rate:.2f} | "
                  f"{share(rate, gflops, fp32_peak)} | {share(rate, gflops, bf16_peak)} | "
                  f"{'-' if agree is None else f'{100 * agree:.1f}% (ran {on_photos})'} |")
        if reference is not None and "top1" in theirs:
            print(f"(our float32 and timm's agree on {100 * np.mean(reference == np.array(theirs['top1'])):.1f}% "
                  "of the photos)")


if __name__ == "__main__":
    main()
