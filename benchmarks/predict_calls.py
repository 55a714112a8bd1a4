"""Images/s of the calls a user makes again and again on one model: ``vit_keras.predict`` and Keras's
``model.predict``, each on ``--batch`` images a call, beside a fresh compiled function each call (what
``vit_keras.predict`` did before it kept its function).

    .venv/bin/python benchmarks/predict_calls.py                 # ViT-Ti/16 at 224, 16 images a call
    .venv/bin/python benchmarks/predict_calls.py --model vit_s16 --batch 16 --calls 5

Random weights: speed does not depend on their values. Ratios measured in one run hold under load; absolute
figures need a quiet machine.
"""

import argparse
import os
import sys
import time
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def images_per_second(call, batch, calls):
    call()  # the warm-up: traces and compiles
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return calls * batch / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_ti16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    import keras
    import numpy as np

    import vit_keras
    from vit_keras.inference.predict import compiled_predict

    model = vit_keras.create_model(args.model, num_classes=1000)
    height, width = model.input_shape[1:3]
    images = np.random.default_rng(0).integers(0, 256, (args.batch, height, width, 3)).astype("float32")
    rows = {
        "vit_keras.predict": lambda: vit_keras.predict(model, images, batch_size=args.batch),
        "model.predict (Keras)": lambda: model.predict(images, batch_size=args.batch, verbose=0),
        "a new compiled function each call": lambda: compiled_predict(weakref.ref(model), 4, True)(
            keras.ops.convert_to_tensor(images)),
    }
    print(f"{args.model} at {height}x{width} px, {args.batch} images a call, {args.calls} calls after a warm-up")
    for name, call in rows.items():
        print(f"{name}: {images_per_second(call, args.batch, args.calls):.1f} img/s")


if __name__ == "__main__":
    main()
