"""Our default recipe against a small CNN trained for the same wall-clock time (prints figures; not a test).

  python benchmarks/versus_cnn.py --data fashion_mnist
  python benchmarks/versus_cnn.py --make-folders /tmp/vs_cnn        # the folders below, from offline data
  python benchmarks/versus_cnn.py --data folder:/tmp/vs_cnn/fmnist_600
  python benchmarks/versus_cnn.py --data folder:/tmp/vs_cnn/digits
  python benchmarks/versus_cnn.py --data folder:/tmp/vs_cnn/digits --vit min_steps=0    # a trial: train() keywords

The ViT is `vit-keras train --data SPEC` with no other flags (`vit_keras.training.train.train(spec, out)`), timed from the
call to its return (loading, building, compiling, the CNN teacher it distills from on small data, and fitting).
The CNN then trains on the same arrays for that many seconds, whole epochs, stopping at the first epoch end past
the budget (so it gets at least the ViT's time). It is `vit_keras.training.distill.small_cnn`, the default's teacher:

    Conv 3x3 x32, ReLU, MaxPool 2 -> Conv 3x3 x64, ReLU, MaxPool 2 -> Dropout 0.5 -> Flatten -> Dense(classes)

Adam (1e-3), batch 128, pixels / 255, no augmentation: the classic Keras MNIST example (~35k parameters at 28x28).
Both are evaluated on the same test split: Fashion-MNIST's test set, a folder's test/ folder. Load average is
printed before and after; a load above the core count means the figures were measured under contention.
--make-folders writes, in the train/ + test/ layout: fmnist_600 and fmnist_100 (600 and 100 Fashion-MNIST
training images a class; test/ = 100 test images a class) and digits (scikit-learn's 8x8 digits upscaled to 28x28,
bilinear; 80/20 seeded split).
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def train_cnn(train, test, seconds, seed=0):
    """The CNN trained for whole epochs until ``seconds`` have passed; (test accuracy, seconds, epochs, params)."""
    import keras

    class TimeBudget(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if time.perf_counter() - self.start >= seconds:
                self.model.stop_training = True

    from vit_keras.training.distill import compile_teacher, small_cnn

    keras.utils.set_random_seed(seed)
    model = compile_teacher(small_cnn(train.images.shape[1:], train.num_classes))  # trained as the teacher is
    one_hot = np.eye(train.num_classes, dtype="float32")[train.labels]
    start = time.perf_counter()
    history = model.fit(train.images.astype("float32"), one_hot, batch_size=128, epochs=10_000,
                        callbacks=[TimeBudget()], verbose=0)
    elapsed = time.perf_counter() - start
    accuracy = float(np.mean(model.predict(test.images.astype("float32"), verbose=0).argmax(-1) == test.labels))
    return accuracy, elapsed, len(history.history["loss"]), model.count_params()


def train_vit(spec, options):
    from vit_keras.training import train
    from vit_keras.models.vision_transformer import load_model

    out = tempfile.mkdtemp(prefix="vs_cnn_vit_")  # fresh: a finished run's folder would return at once
    start = time.perf_counter()
    record = train.train(spec, out, **options)
    elapsed = time.perf_counter() - start
    model = load_model(os.path.join(out, "model.keras"))
    return model, record, elapsed


def compare(spec, options, cnn_too=True):
    from vit_keras.data.datasets import load_dataset
    from vit_keras.training.evaluation import evaluate_arrays

    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    model, record, vit_seconds = train_vit(spec, options)
    test = load_dataset(spec, "test", image_size=model.input_shape[1:3])
    vit_accuracy = evaluate_arrays(model, test.images, test.labels, test.class_names)["accuracy"]
    train = load_dataset(spec, "train", image_size=model.input_shape[1:3])
    if cnn_too:
        cnn_accuracy, cnn_seconds, epochs, params = train_cnn(train, test, vit_seconds, seed=options.get("seed", 0))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"\n{spec}: {len(train.labels):,} training images, {len(test.labels):,} test images "
          f"({test.source or 'its test split'})")
    print("| model | parameters | test accuracy | wall time |")
    print("|---|---|---|---|")
    steps = record["epochs"] * record["steps_per_epoch"]
    trial = ", ".join(f"{key}={value}" for key, value in options.items())
    print(f"| vit-keras {trial or 'default'} ({record.get('model')}, {record.get('epochs')} epochs, {steps:,} steps, "
          f"augment {record.get('augment')}) | {model.count_params():,} | {100 * vit_accuracy:.2f}% | {vit_seconds:.0f} s |")
    if cnn_too:
        print(f"| small CNN ({epochs} epochs) | {params:,} | {100 * cnn_accuracy:.2f}% | {cnn_seconds:.0f} s |")


def make_folders(root):
    from PIL import Image

    from vit_keras.data.datasets import FASHION_MNIST_CLASSES, load_arrays

    def write(folder, images, labels, names):
        for i, (image, label) in enumerate(zip(images, labels)):
            os.makedirs(os.path.join(folder, names[label]), exist_ok=True)
            Image.fromarray(image.squeeze(-1)).save(os.path.join(folder, names[label], f"{i:05d}.png"))

    names = [n.replace("/", "-") for n in FASHION_MNIST_CLASSES]
    train_x, train_y, _ = load_arrays("fashion_mnist", "train")
    test_x, test_y, _ = load_arrays("fashion_mnist", "test")
    test_keep = np.concatenate([np.flatnonzero(test_y == c)[:100] for c in range(10)])
    for per_class in (600, 100):
        keep = np.concatenate([np.flatnonzero(train_y == c)[:per_class] for c in range(10)])
        folder = os.path.join(root, f"fmnist_{per_class}")
        write(os.path.join(folder, "train"), train_x[keep], train_y[keep], names)
        write(os.path.join(folder, "test"), test_x[test_keep], test_y[test_keep], names)
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = np.clip(digits.images * 16, 0, 255).astype(np.uint8)
    big = np.stack([np.asarray(Image.fromarray(x).resize((28, 28), Image.BILINEAR)) for x in small])[..., None]
    order = np.random.default_rng(0).permutation(len(big))
    cut = len(big) * 4 // 5
    digit_names = [str(d) for d in range(10)]
    write(os.path.join(root, "digits", "train"), big[order[:cut]], digits.target[order[:cut]], digit_names)
    write(os.path.join(root, "digits", "test"), big[order[cut:]], digits.target[order[cut:]], digit_names)
    print(f"wrote {root}/fmnist_600, {root}/fmnist_100, {root}/digits")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="fashion_mnist")
    parser.add_argument("--make-folders", metavar="DIR", default=None)
    parser.add_argument("--vit", action="append", default=[], metavar="KEY=VALUE",
                        help="a trial: a `train()` keyword for the ViT (repeatable), e.g. --vit min_steps=2000")
    parser.add_argument("--vit-only", action="store_true", help="a ViT trial alone, without the CNN")
    args = parser.parse_args()
    if args.make_folders:
        make_folders(args.make_folders)
    else:
        compare(args.data, dict(parse_option(text) for text in args.vit), cnn_too=not args.vit_only)


def parse_option(text):
    """"key=value" -> (key, value), the value read as a Python literal where it is one."""
    import ast

    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


if __name__ == "__main__":
    main()
