"""LiteRT latency of .tflite files at batch 1 on 1 and 2 threads, with and without XNNPACK: which part of a file
scales with the second core (docs/benchmarks.md#inference-against-the-peers). A part: the runtime alone.

    .venv/bin/python benchmarks/litert_threads.py FILE.tflite [FILE.tflite ...] [--runs 40]
"""

import argparse
import time

import numpy as np


def latencies_ms(path, thread_counts=(1, 2), xnnpack=True, runs=40, block=5):
    """{threads: median milliseconds of ``runs`` invocations} of one random input, after 5 warm-up ones, one
    interpreter a thread count, run in turns ``block`` invocations at a time: a shared VM's speed drifts by 10-30%
    over a minute, so the ratio of two thread counts timed one after the other would not be the file's."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    options = {} if xnnpack else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    interpreters = {}
    for threads in thread_counts:
        interpreter = Interpreter(model_path=path, num_threads=threads, **options)
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        interpreter.set_tensor(detail["index"], np.random.default_rng(0).integers(0, 255, detail["shape"])
                               .astype(detail["dtype"]))
        for _ in range(5):
            interpreter.invoke()
        interpreters[threads] = interpreter
    times = {threads: [] for threads in thread_counts}
    for _ in range(-(-runs // block)):
        for threads, interpreter in interpreters.items():
            for _ in range(block):
                start = time.perf_counter()
                interpreter.invoke()
                times[threads].append(time.perf_counter() - start)
    return {threads: 1e3 * float(np.median(t)) for threads, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    for path in args.files:
        cells = {f"{'XNNPACK' if xnnpack else 'builtin'} {threads}T": ms for xnnpack in (True, False)
                 for threads, ms in latencies_ms(path, (1, 2), xnnpack, args.runs).items()}
        print(path, "  ".join(f"{name} {ms:.2f} ms" for name, ms in cells.items()),
              f"  2T/1T (XNNPACK) {cells['XNNPACK 2T'] / cells['XNNPACK 1T']:.2f}")

if __name__ == "__main__":
    main()
