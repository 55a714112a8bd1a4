"""LiteRT at batch 1 on 1 and 2 threads, the export graph's attention in its two layouts (issue 45), a part.

The export graph computes attention with all heads batched into 4-D ops (``convert.attention_graph``: ~13 ops a
block); until 2026-12-07 it took one head at a time (~45 ops a block), which is what the int16 graph still does.
This exports a model both ways in float32, dynamic int8 and static int8 and prints, for each, top-1 agreement
with Keras, the 1- and 2-thread latency (median of --runs, the two timed in turns) and their ratio
(docs/benchmarks.md).

    .venv/bin/python benchmarks/litert_batched_heads.py --real /work/real [--runs 60] [--test 200]
"""
import argparse
import functools
import os
import tempfile

from litert_threads import latencies_ms  # benchmarks/ is on the path when a script of it runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", required=True, help="the real ViT-Ti/16 fixture folder (weights and photos)")
    parser.add_argument("--runs", type=int, default=60, help="invocations a latency is the median of")
    parser.add_argument("--test", type=int, default=200, help="photos the agreement with Keras is measured on")
    parser.add_argument("--calibration", type=int, default=300, help="int8 calibration photos")
    args = parser.parse_args()

    from vit_keras.convert import graph
    from real_vit_int8 import build_model, load_photos

    model = build_model(args.real)
    photos = load_photos(args.real)[0]
    test, calibration = photos[1::2][:args.test], photos[::2][:args.calibration]
    reference = graph.keras_scores(model, test).argmax(-1)
    batched = graph.attention
    try:
        compare_layouts(graph, batched, model, test, calibration, reference, args)
    finally:
        graph.attention = batched


def compare_layouts(graph, attention, model, test, calibration, reference, args):
    """Export and time each layout and mode, printing a line each (``graph.attention`` patched per layout)."""
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.runtime import tflite_scores

    with tempfile.TemporaryDirectory() as work:
        for layout in ("one head at a time", "heads batched"):
            graph.attention = functools.partial(attention, batched=layout == "heads batched")
            for mode, activations in (("float32", "auto"), ("int8", "dynamic"), ("int8", "static")):
                out = os.path.join(work, f"{layout[:3]}_{mode}_{activations}.tflite")
                export_tflite(model, out, quantize=mode, calibration=calibration, int8_activations=activations,
                              labels=os.path.join(args.real, "labels.txt"), calibration_size=len(calibration))
                agree = 100 * (tflite_scores(out, test).argmax(-1) == reference).mean()
                one, two = latencies_ms(out, (1, 2), runs=args.runs).values()
                print(f"{layout:19s} {mode:7s} {activations:7s} agree {agree:5.1f}%  1T {one:6.2f} ms  "
                      f"2T {two:6.2f} ms  2T/1T {two / one:.2f}", flush=True)


if __name__ == "__main__":
    main()
