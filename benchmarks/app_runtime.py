"""Which LiteRT API should the app use? The classic Interpreter vs CompiledModel, same model, same input.

    python benchmarks/app_runtime.py MODEL.tflite [MODEL2.tflite ...] [--runs 50] [--threads 1 2]

Times the app's own inference call (Classifier._run: write input, run, read outputs) after a warm-up,
median and p90 over --runs, alternating the two runtimes per repeat so machine load hits both alike.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vit_keras.apps.classifier import Classifier  # noqa: E402
from vit_keras.constants import RUNTIMES  # noqa: E402


def time_runs(classifier, runs):
    batch = np.random.default_rng(0).integers(0, 256, (1, classifier.height, classifier.width,
                                                       classifier.channels)).astype(classifier.input_dtype)
    for _ in range(5):
        classifier._run(batch)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        classifier._run(batch)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    print("| model | threads | Interpreter median (p90) ms | CompiledModel median (p90) ms |")
    print("|---|---|---|---|")
    for model in args.models:
        for threads in args.threads:
            classifiers = {r: Classifier(model, threads=threads, runtime=r) for r in RUNTIMES}
            samples = {r: [] for r in RUNTIMES}
            for _ in range(args.repeats):
                for runtime in RUNTIMES:
                    samples[runtime] += time_runs(classifiers[runtime], args.runs)
            cells = [f"{statistics.median(samples[r]):.2f} ({np.percentile(samples[r], 90):.2f})" for r in RUNTIMES]
            print(f"| {Path(model).name} | {threads} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
