"""Test-only: tiny ViTs trained on Fashion-MNIST, saved as a run and exported to .tflite (uses TensorFlow; the
app never does).

``train_fashion_run(folder, ...)`` trains the 1-block ViT that test_convert.py and the app's tests share and saves it
as a training run (model.keras + labels.txt). ``build_models(out_dir)`` trains it for a few hundred steps and writes
  - model.keras + labels.txt                       (the training contract's run directory)
  - float32/float16/dynamic/int8.tflite            with convert's exporter (RGB input, metadata)
  - attention.tflite  1-channel raw-pixel float input, logits + attention outputs
``build_rgb_models(out_dir)`` fits a tiny RGB ViT with per-channel normalization on foolbox's CIFAR-10 photos and
exports it to int8 and float32; ``photo_files(folder)`` gives foolbox's ImageNet photos at several sizes.
"""

import os
from pathlib import Path

import numpy as np

from vit_keras.constants import QUANTIZATIONS
from vit_keras.data.datasets import FASHION_MNIST_CLASSES, load_arrays

FASHION_VIT = dict(image_size=28, channels=1, patch_size=7, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1,
                   num_classes=10, include_preprocessing=True)


def train_fashion_run(folder, images, labels, batch_size, epochs):
    """The tiny Fashion-MNIST ViT (seed 0, Adam 3e-3) fitted on ``images``, saved in ``folder``; returns the model."""
    import keras

    import vit_keras

    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", **FASHION_VIT)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images.astype("float32"), labels, batch_size=batch_size, epochs=epochs, verbose=0)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / "model.keras")
    (folder / "labels.txt").write_text("\n".join(FASHION_MNIST_CLASSES) + "\n")
    return model


def _attention_model(model, out_path, labels):
    """float32, 1-channel raw-pixel input, logits + every block's attention (B, L, heads, T, T) as outputs.

    convert/ exports no attention output yet; this is the form the app's overlay reads, built with
    convert's own metadata writer.
    """
    import tensorflow as tf

    from vit_keras.convert.export import classifier_metadata, write_atomic
    from vit_keras.convert.metadata import populate

    blocks = model.blocks

    @tf.function(input_signature=[tf.TensorSpec((1, 28, 28, 1), tf.float32, name="image")])
    def serve(images):
        x, maps = images, []
        for layer in model.layers[1:]:
            if layer in blocks:
                x, weights = layer(x, return_attention_scores=True)
                maps.append(weights)
            else:
                x = layer(x)
        return {"logits": x, "attention": tf.stack(maps, axis=1)}

    # The Keras model as trackable_obj gave NaN scores here (TF 2.21); the older path converts it correctly.
    converter = tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()])
    meta = classifier_metadata(model, labels, "float32", np.float32, name="fashion-vit-tiny-attention",
                               description="A 1-block ViT with an attention output (test fixture).")
    tensor_in = meta["subgraph_metadata"][0]["input_tensor_metadata"][0]
    tensor_in["content"]["content_properties"]["color_space"] = "GRAYSCALE"
    tensor_in["process_units"][0]["options"] = {"mean": [0.0], "std": [1.0]}  # the model rescales raw pixels
    tensor_in.pop("stats")
    meta["subgraph_metadata"][0]["output_tensor_metadata"].append({"name": "attention"})
    data = populate(converter.convert(), meta, {"labels.txt": ("\n".join(labels) + "\n").encode()})
    write_atomic(str(out_path), data)


def build_models(out_dir, steps=200):
    """Train, save and export; returns {quantization | "attention" | "keras" | "labels": path}."""
    import keras

    from vit_keras.convert.export import export_tflite

    out_dir = Path(out_dir)
    images, labels, _ = load_arrays("fashion_mnist", "train", limit=steps * 64)
    model = train_fashion_run(out_dir, images, labels, batch_size=64, epochs=1)
    calibration = images[:200]
    paths = {"keras": out_dir / "model.keras", "labels": out_dir / "labels.txt"}
    for mode in QUANTIZATIONS:
        paths[mode] = out_dir / f"{mode}.tflite"
        export_tflite(model, paths[mode], quantize=mode, labels=FASHION_MNIST_CLASSES,
                      calibration=calibration if mode == "int8" else None, calibration_size=200)
    paths["attention"] = out_dir / "attention.tflite"
    _attention_model(model, paths["attention"], FASHION_MNIST_CLASSES)
    keras.backend.clear_session()
    return paths


RGB_VIT = dict(image_size=32, channels=3, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1,
               num_classes=10, include_preprocessing=True, pixel_mean="imagenet")  # per channel: export folds it


def foolbox_photos(pattern, size):
    """foolbox's photos matching ``pattern`` as uint8 (N, size, size, 3), and the label in each file's name."""
    from PIL import Image

    from vit_keras.apps.examples import foolbox_data_dir

    paths, images = sorted(foolbox_data_dir().glob(pattern)), []
    for path in paths:
        with Image.open(path) as photo:
            images.append(np.asarray(photo.convert("RGB").resize((size, size), Image.BILINEAR)))
    return np.stack(images), np.array([int(path.stem.rsplit("_", 1)[1]) for path in paths])


def build_rgb_models(out_dir, repeats=40):
    """A tiny RGB ViT normalized per channel (ImageNet's mean and std), fitted on foolbox's 20 CIFAR-10 photos and
    exported to int8 and float32; returns {"int8" | "float32": path}."""
    import keras

    import vit_keras
    from vit_keras.apps.examples import CIFAR10_CLASSES
    from vit_keras.convert.export import export_tflite

    keras.utils.set_random_seed(0)
    images, labels = foolbox_photos("cifar10_*.png", RGB_VIT["image_size"])
    model = vit_keras.create_model("vit_ti16", **RGB_VIT)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # One epoch of the photos repeated: Keras' per-epoch overhead is most of the time at this size.
    model.fit(np.tile(images, (repeats, 1, 1, 1)).astype("float32"), np.tile(labels, repeats),
              batch_size=len(images), epochs=1, verbose=0)
    calibration = np.concatenate([foolbox_photos(pattern, RGB_VIT["image_size"])[0]
                                  for pattern in ("cifar10_*.png", "cifar100_*.png", "imagenet_*.jpg")] * 2)
    paths = {}
    for mode in ("int8", "float32"):
        paths[mode] = Path(out_dir) / f"rgb_{mode}.tflite"
        export_tflite(model, paths[mode], quantize=mode, labels=CIFAR10_CLASSES,
                      calibration=calibration if mode == "int8" else None, calibration_size=len(calibration))
    keras.backend.clear_session()
    return paths


if __name__ == "__main__":
    import sys
    import time

    start = time.time()
    print(build_models(sys.argv[1]), f"{time.time() - start:.1f}s")


def shared_models(tmp_path_factory):
    """build_models once per test run, shared by pytest-xdist workers through a lock file."""
    import fcntl
    import json

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the directory all workers of this run share
    out_dir = root / "app_models"
    done = root / "app_models.json"
    with open(root / "app_models.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            paths = build_models(out_dir)
            done.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return {k: Path(v) for k, v in json.loads(done.read_text()).items()}


def _png_header_only(path, width, height):
    """A PNG whose header claims width x height with almost no data: a decompression bomb's signature."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (width + 1))  # one row; Pillow refuses at open, before decoding
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def bad_inputs(out_dir, photo):
    """name -> (path, words the error message must contain). ``photo`` is a real JPEG."""
    from PIL import Image

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = {}
    text = out_dir / "notes.png"
    text.write_text("this is not an image\n")
    cases["not_image"] = (text, "not an image")
    empty = out_dir / "empty.jpg"
    empty.write_bytes(b"")
    cases["zero_bytes"] = (empty, "empty")
    data = Path(photo).read_bytes()
    truncated = out_dir / "truncated.jpg"
    truncated.write_bytes(data[: len(data) // 2])
    cases["truncated_jpeg"] = (truncated, "truncated")
    bomb = out_dir / "bomb.png"
    _png_header_only(bomb, 12_000, 12_000)  # 144 MP: above Pillow's error threshold (2 x 64 MP)
    cases["bomb"] = (bomb, "decompression bomb")
    warn_bomb = out_dir / "bomb_warning.png"
    _png_header_only(warn_bomb, 9_000, 9_000)  # 81 MP: Pillow only warns; the app refuses it too
    cases["bomb_warning_level"] = (warn_bomb, "decompression bomb")
    with Image.open(photo) as image:
        image.save(out_dir / "ok.jpg")
    return cases


# foolbox's ImageNet photos (512 x 512 but one), most at a size the page and the CLI must resize from, one at the
# model's own; None keeps the JPEG as it is (its top-1 must be clear: see test_page_top1_equals_cli_on_photos).
PHOTO_SIZES = {"imagenet_00_243.jpg": None, "imagenet_01_559.jpg": (300, 200), "imagenet_02_438.jpg": (200, 300),
               "imagenet_04_949.jpg": (RGB_VIT["image_size"],) * 2, "imagenet_05_853.jpg": (45, 61),
               "imagenet_06_609.jpg": (400, 512), "imagenet_08_915.jpg": (640, 480), "imagenet_10_541.jpg": None}


def photo_files(folder):
    """PHOTO_SIZES' photos in ``folder``: each a copy of foolbox's file or that photo resized and saved as PNG."""
    from PIL import Image

    from vit_keras.apps.examples import foolbox_data_dir

    paths = []
    for name, size in PHOTO_SIZES.items():
        source = foolbox_data_dir() / name
        if size is None:
            paths.append(folder / name)
            paths[-1].write_bytes(source.read_bytes())
            continue
        paths.append(folder / f"{source.stem}_{size[0]}x{size[1]}.png")
        with Image.open(source) as photo:
            photo.resize(size, Image.LANCZOS).save(paths[-1])
    return paths


def mode_variants(out_dir, gray):
    """A real grayscale uint8 image (H, W) saved as grayscale / RGBA / CMYK / palette / 16-bit PNG / GIF."""
    from PIL import Image

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Image.fromarray(gray, "L")
    paths = {"gray": out_dir / "gray.png"}
    base.save(paths["gray"])
    rgba = base.convert("RGBA")
    paths["rgba"] = out_dir / "rgba.png"
    rgba.save(paths["rgba"])
    paths["cmyk"] = out_dir / "cmyk.tiff"
    base.convert("RGB").convert("CMYK").save(paths["cmyk"])
    paths["palette"] = out_dir / "palette.png"
    base.convert("P").save(paths["palette"])
    paths["png16"] = out_dir / "sixteen.png"
    Image.fromarray(gray.astype(np.uint16) * 257).save(paths["png16"])
    paths["gif_animated"] = out_dir / "animated.gif"
    other = Image.fromarray(255 - gray, "L")
    base.save(paths["gif_animated"], save_all=True, append_images=[other, other], duration=100, loop=0)
    return paths
