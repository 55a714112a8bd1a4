"""Input pipeline throughput and memory: one training epoch read in memory, streamed from JPEGs, streamed from shards.

    python benchmarks/input_pipeline.py --images 6000 --image-size 224        # tf.data (TensorFlow's pipeline)
    KERAS_BACKEND=jax python benchmarks/input_pipeline.py --images 6000 --image-size 224 --pipeline pydataset

Generates a folder of JPEG "photos" (smooth random colour fields, 10 classes) under --work unless it is there,
writes it as PNG shards at the image size once (`vit-keras prepare`, timed), then measures each way of reading it
in a process of its own: images/s of the augmented training batches (random-resized crop + flip, as a run makes
them) over one epoch, and the process's peak resident memory (resource.getrusage). "memory" includes decoding the
folder into arrays first; its images/s is that of the epoch alone. --model vit_ti16 also times that model's
training steps at the size on random data (images/s), the rate the input has to keep up with.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vit_keras.cpu import cpu_features  # noqa: E402  (after the path)

MODES = ("memory", "folder", "shards")


def generate(folder, count, classes=10, size=(240, 320), seed=0):
    """``count`` JPEGs of smooth random colour fields (upsampled noise), about 15-25 KB each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        path = os.path.join(folder, f"class{i % classes}", f"{i:06d}.jpg")
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize(size[::-1], Image.BICUBIC)
        noise = rng.normal(0, 12, (*size, 3))
        pixels = np.clip(np.asarray(image, np.float32) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=90)


def batches_of(mode, args):
    """(an iterable of training batches, its steps in one epoch, seconds spent decoding into memory first)."""
    import keras

    from vit_keras.data import sources
    from vit_keras.data.augmentation import Augmentation, Batching

    size = (args.image_size, args.image_size)
    spec = f"shards:{args.shards}" if mode == "shards" else f"folder:{args.folder}"
    source = sources.list_split(spec, "train", image_size=None if mode == "shards" else size)
    batching = Batching(source.num_classes, size, 3, args.batch_size, training=True)
    augmentation = Augmentation("crop")
    steps = sources.steps_per_pass(source, args.batch_size)
    start = time.perf_counter()
    if mode == "memory":
        data = source.decode_all()
        decoded = time.perf_counter() - start
        if keras.backend.backend() == "tensorflow" and args.pipeline == "tf.data":
            from vit_keras.data.pipeline import make_dataset

            return make_dataset(data.images, data.labels, **vars_of(batching), augmentation=augmentation), steps, \
                decoded
        from vit_keras.data.array_pipeline import make_batches

        batches = make_batches(data.images, data.labels, **vars_of(batching), augmentation=augmentation)
        return iter_pydataset(batches), steps, decoded
    if keras.backend.backend() == "tensorflow" and args.pipeline == "tf.data":
        from vit_keras.data.stream import stream_dataset

        return stream_dataset(source, batching, augmentation), steps, 0.0
    from vit_keras.data.stream_batches import StreamBatches

    return iter_pydataset(StreamBatches(source, batching, augmentation, steps)), steps, 0.0


def vars_of(batching):
    import dataclasses

    return dataclasses.asdict(batching)


def iter_pydataset(batches):
    """A PyDataset's batches as ``fit`` reads them: its ``workers`` threads make them ahead, in order."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(batches.workers)
    return pool.map(batches.__getitem__, range(len(batches)))


def measure(mode, args):
    """One epoch of ``mode``'s batches in this process: a dict of its figures."""
    start = time.perf_counter()
    batches, steps, decoded = batches_of(mode, args)
    iterator = iter(batches)
    first = time.perf_counter()
    next(iterator)
    warm = time.perf_counter()
    for _ in range(steps - 1):
        next(iterator)
    end = time.perf_counter()
    return dict(mode=mode, steps=steps, images=steps * args.batch_size, setup_s=round(first - start, 1),
                decode_s=round(decoded, 1), epoch_s=round(end - first, 1),
                images_per_s=round((steps - 1) * args.batch_size / (end - warm), 1),
                peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def model_rate(args):
    """Training images/s of ``args.model`` at the image size on random data (a few steps after warm-up)."""
    import keras

    from vit_keras.factory import create_model
    from vit_keras.training.train import compile_model

    model = create_model(args.model, image_size=args.image_size, num_classes=10, include_preprocessing=True)
    compile_model(model, 1e-4)
    x = np.random.default_rng(0).uniform(0, 255, (args.model_batch, args.image_size, args.image_size, 3))
    y = keras.utils.to_categorical(np.arange(args.model_batch) % 10, 10)
    model.train_on_batch(x.astype("float32"), y)
    start = time.perf_counter()
    for _ in range(args.model_steps):
        model.train_on_batch(x.astype("float32"), y)
    return args.model_steps * args.model_batch / (time.perf_counter() - start)


def child(mode, args):
    """Run one measurement in a fresh process (its own peak memory) and return its figures."""
    command = [sys.executable, os.path.abspath(__file__), "--measure", mode, *sys.argv[1:]]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.dirname(
        HERE)})
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--work", default="/tmp/vit_keras_input_bench")
    parser.add_argument("--pipeline", choices=("tf.data", "pydataset"), default="tf.data")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--model", default=None, help="also time this model's training steps, e.g. vit_ti16")
    parser.add_argument("--model-batch", type=int, default=32)
    parser.add_argument("--model-steps", type=int, default=5)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.folder = os.path.join(args.work, f"photos{args.images}")
    args.shards = os.path.join(args.work, f"shards{args.images}_{args.image_size}")
    if args.measure:
        print(json.dumps(model_rate(args) if args.measure == "model" else measure(args.measure, args)))
        return
    generate(args.folder, args.images)
    if "shards" in args.modes.split(",") and not os.path.exists(os.path.join(args.shards, "shards.json")):
        from vit_keras.data.prepare import prepare

        start = time.perf_counter()
        prepare(f"folder:{args.folder}", args.shards, args.image_size, log=lambda line: None)
        print(f"prepare: {args.images:,} images in {time.perf_counter() - start:.0f} s")
    import keras

    print(f"{cpu_features().describe()}; Keras {keras.__version__} on {keras.backend.backend()}, {args.pipeline}; "
          f"{args.images:,} JPEGs 320x240 (~90% train), read at {args.image_size} px, batch {args.batch_size}")
    print("| mode | images/s (epoch) | epoch s | setup s | decode s | peak RSS MB |\n|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        r = child(mode, args)
        print(f"| {mode} | {r['images_per_s']:,} | {r['epoch_s']} | {r['setup_s']} | {r['decode_s']} | "
              f"{r['peak_rss_mb']:,} |")
    if args.model:
        print(f"{args.model} training at {args.image_size} px, batch {args.model_batch}: "
              f"{child('model', args):.1f} images/s")


if __name__ == "__main__":
    main()
