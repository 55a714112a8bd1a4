"""How long Keras's ``quantize`` takes on a ViT, with Keras's garbage collection per layer and with ours once.

    .venv/bin/python benchmarks/quantize_gc.py [--model vit_b16] [--repeats 3]

Keras's ``Layer.__delattr__`` runs a full ``gc.collect()`` for each kernel ``quantize`` deletes;
``VisionTransformer.quantize`` wraps it in ``vit_keras.framework.one_garbage_collection``. In one process, in turns:
``keras.Model.quantize`` (Keras's, a pass a layer) and the model's own ``quantize``, each on a fresh rebuild of the
same model; then ``vit_keras.load_model`` of the quantized file, which re-quantizes as it loads.
"""

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

import vit_keras  # noqa: E402
from vit_keras.framework import flatten_layers  # noqa: E402


def dense_only(layer):
    return isinstance(layer, keras.layers.Dense)


def seconds(action):
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_b16", choices=vit_keras.list_models())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model = vit_keras.create_model(args.model)
    print(f"{args.model}: {sum(map(dense_only, flatten_layers(model)))} Dense layers; "
          f"{len(gc.get_objects()):,} objects tracked by the collector")
    times = {"keras.Model.quantize (a collection a layer)": [], "VisionTransformer.quantize (one)": []}
    for _ in range(args.repeats):
        copy = model.rebuild()
        times["keras.Model.quantize (a collection a layer)"].append(
            seconds(lambda: keras.Model.quantize(copy, "int8", filters=dense_only)))
        copy = model.rebuild()
        times["VisionTransformer.quantize (one)"].append(seconds(lambda: copy.quantize("int8", filters=dense_only)))
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "int8.keras")
        copy.save(path)
        times["vit_keras.load_model of the int8 file"] = [seconds(lambda: vit_keras.load_model(path))
                                                          for _ in range(args.repeats)]
    for label, runs in times.items():
        print(f"{label}: median {statistics.median(runs):.2f} s ({', '.join(f'{t:.2f}' for t in runs)})")


if __name__ == "__main__":
    main()
