"""vit_keras.data.datasets and vit_keras.data.pipeline: real Fashion-MNIST, image folders, a local tfds dataset, tf.data."""

import gzip
import os

import numpy as np
import pytest
from PIL import Image

from vit_keras.data import datasets as vdata
from vit_keras.data.augmentation import Augmentation
from vit_keras.data.pipeline import make_dataset, random_resized_crop


def test_fashion_mnist_from_debian_idx_files():
    images, labels, names = vdata.load_arrays("fashion_mnist", "test", limit=500)
    assert images.shape == (500, 28, 28, 1) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and set(np.unique(labels)) <= set(range(10))
    assert names[0] == "T-shirt/top" and len(names) == 10
    assert images.max() > 200  # real pixels, not zeros


def test_read_idx_roundtrip_and_bad_magic(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, 3]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape) + array.tobytes())
    np.testing.assert_array_equal(vdata.read_idx(path), array)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x12\x34\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="magic"):
        vdata.read_idx(bad)


def make_folder(root, classes=("cat", "dog"), per_class=6):
    modes = ["L", "RGB", "RGBA", "P", "I;16", "1"]
    rng = np.random.default_rng(0)
    for c in classes:
        os.makedirs(root / c, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (20 + 2 * i, 24, 3), dtype=np.uint8)
            mode = modes[i % len(modes)]
            if mode == "I;16":
                image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 200)
            else:
                image = Image.fromarray(pixels).convert(mode)
            image.save(root / c / f"{i}.png")
    return root


def test_training_decodes_images_as_the_app_does(tmp_path):
    """No train/device skew: 16-bit, float, EXIF-rotated, transparent and palette images give the same pixels."""
    from vit_keras.apps.images import load_image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    Image.fromarray(pixels).save(tmp_path / "rotated.jpg", exif=exif)
    Image.fromarray(pixels[..., 0].astype(np.uint16) * 250).save(tmp_path / "deep.png")
    Image.fromarray(pixels[..., 0].astype(np.float32) / 255).save(tmp_path / "float.tif")
    Image.fromarray(np.dstack([pixels, pixels[..., :1]])).save(tmp_path / "alpha.png")
    Image.fromarray(pixels).convert("P").save(tmp_path / "palette.png", transparency=0)
    Image.fromarray(pixels).convert("1").save(tmp_path / "bits.png")
    for name in ("rotated.jpg", "deep.png", "float.tif", "alpha.png", "palette.png", "bits.png"):
        app = np.asarray(load_image(tmp_path / name)[0])
        np.testing.assert_array_equal(vdata.decode_image(tmp_path / name), app[..., None] if app.ndim == 2 else app,
                                      err_msg=name)
    assert vdata.decode_image(tmp_path / "rotated.jpg").shape == (16, 12, 3)


def test_folder_skips_corrupt_images_and_mixes_sizes_and_modes(tmp_path):
    root = make_folder(tmp_path / "pets")
    (root / "cat" / "broken.jpg").write_bytes(b"not an image")
    (root / "dog" / "truncated.png").write_bytes((root / "dog" / "1.png").read_bytes()[:60])
    (root / "dog" / "notes.txt").write_text("ignored: not an image extension")
    both = [vdata.load_dataset(f"folder:{root}", split, val_fraction=0.3, seed=1) for split in ("train", "val")]
    assert sum(len(d.skipped) for d in both) == 2
    assert sum(len(d.labels) for d in both) == 12
    few = vdata.load_dataset(f"folder:{root}", "train", val_fraction=0.3, seed=1, limit=3)  # decodes 3, not all
    assert len(few.labels) == 3 and set(few.labels.tolist()) == {0, 1}  # class-balanced, not the first 3
    for d in both:
        assert d.images.dtype == np.uint8 and d.images.ndim == 4 and d.images.shape[-1] == 3
        assert d.class_names == ["cat", "dog"]
    again = vdata.load_dataset(f"folder:{root}", "val", val_fraction=0.3, seed=1)
    np.testing.assert_array_equal(again.images, both[1].images)  # the split is seeded
    other = vdata.load_dataset(f"folder:{root}", "val", val_fraction=0.3, seed=2)
    assert not np.array_equal(other.labels, both[1].labels) or not np.array_equal(other.images, both[1].images)
    sized = vdata.load_dataset(f"folder:{root}", "train", val_fraction=0.3, image_size=16)
    assert sized.images.shape[1:] == (16, 16, 3)


def test_folder_images_are_resized_as_they_decode(tmp_path, monkeypatch):
    """Memory at the model's size, not the camera's: big photos shrink on decode, as the app prepares them."""
    from vit_keras.apps.images import load_image

    rng = np.random.default_rng(0)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 90x60, shown 60x90: the header size is turned upright too
    for c in ("a", "b"):
        (tmp_path / "big" / c).mkdir(parents=True)
        for i in range(3):
            pixels = rng.integers(0, 255, (60, 90, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "big" / c / f"{i}.jpg", exif=exif, quality=95)
    (tmp_path / "big" / "a" / ".thumbnails").mkdir()  # a viewer's hidden copies are not training data
    Image.fromarray(pixels).save(tmp_path / "big" / "a" / ".thumbnails" / "0.jpg")
    monkeypatch.setattr(vdata, "MAX_SIDE", 45)
    capped = vdata.load_dataset(f"folder:{tmp_path / 'big'}", "train", val_fraction=0.34)
    assert capped.images.shape[1:] == (45, 30, 3) and len(capped.images) == 4
    assert vdata.folder_image_size(str(tmp_path / "big")) == (45, 30)
    sized = vdata.load_dataset(f"folder:{tmp_path / 'big'}", "train", val_fraction=0.34, image_size=(24, 16))
    assert sized.images.shape[1:] == (24, 16, 3)
    first = sorted((tmp_path / "big").glob("*/*.jpg"))
    app = load_image(first[0], target_size=(16, 24))[0].resize((16, 24), Image.BILINEAR, reducing_gap=3.0)
    np.testing.assert_array_equal(vdata.decode_image(first[0], (24, 16)), np.asarray(app))


@pytest.mark.parametrize("name", ["caf\udce9", " padded", "two\nlines"])
def test_class_names_that_would_break_labels_txt_are_refused(name, tmp_path):
    make_folder(tmp_path / "pets", classes=("ok", "fine"))
    try:
        os.makedirs(tmp_path / "pets" / name)
    except (UnicodeEncodeError, OSError):
        pytest.skip("this file system refuses the name itself")
    Image.new("RGB", (8, 8)).save(tmp_path / "pets" / name / "x.png")
    with pytest.raises(ValueError, match="rename it"):
        vdata.load_arrays(f"folder:{tmp_path / 'pets'}")


def test_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        vdata.load_arrays(f"folder:{tmp_path / 'missing'}")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images"):
        vdata.load_arrays(f"folder:{tmp_path / 'empty'}")
    make_folder(tmp_path / "one", classes=("only",))
    with pytest.raises(ValueError, match="only one class"):
        vdata.load_arrays(f"folder:{tmp_path / 'one'}")
    with pytest.raises(ValueError, match="Unknown dataset"):
        vdata.load_arrays("mnist_please")
    with pytest.raises(ValueError, match="split"):
        vdata.load_arrays("fashion_mnist", split="dev")


def test_local_tfds_dataset(tmp_path):
    import tensorflow_datasets as tfds

    class VitKerasTinyShapes(tfds.core.GeneratorBasedBuilder):
        """Six 8x8 RGB images in two classes, built offline."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict({
                    "image": tfds.features.Image(shape=(8, 8, 3)),
                    "label": tfds.features.ClassLabel(names=["dark", "light"]),
                }),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(6), "test": self._generate_examples(2)}

        def _generate_examples(self, n):
            for i in range(n):
                label = i % 2
                yield i, {"image": np.full((8, 8, 3), 40 + 170 * label, np.uint8), "label": label}

    images, labels, names = vdata.load_arrays("tfds:vit_keras_tiny_shapes", "train", data_dir=str(tmp_path))
    assert images.shape == (6, 8, 8, 3) and names == ["dark", "light"]
    assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert all(images[i].mean() == 40 + 170 * labels[i] for i in range(6))
    test_images, _, _ = vdata.load_arrays("tfds:vit_keras_tiny_shapes", "test", data_dir=str(tmp_path))
    assert len(test_images) == 2
    assert len(vdata.load_arrays("tfds:vit_keras_tiny_shapes", "train", data_dir=str(tmp_path), limit=4)[0]) == 4

    class VitKerasTrainOnly(VitKerasTinyShapes):
        """Like tf_flowers: a train split only."""

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(10)}

    split = dict(data_dir=str(tmp_path), seed=3, val_fraction=0.3)
    train = vdata.load_dataset("tfds:vit_keras_train_only", "train", **split)
    val = vdata.load_dataset("tfds:vit_keras_train_only", "val", **split)
    assert len(train.images) == 7 and len(val.images) == 3  # a seeded held-out part, the rest trains
    assert len(vdata.load_dataset("tfds:vit_keras_train_only", "test", **split).images) == 3
    with pytest.raises(FileNotFoundError, match="not found"):
        vdata.load_arrays("tfds:no_such_dataset_here", data_dir=str(tmp_path))


@pytest.fixture(scope="module")
def fashion(fashion_train):
    images, labels = fashion_train
    return images[:256], labels[:256]


def batches(dataset, n=2):
    return [(x.numpy(), y.numpy()) for x, y in dataset.take(n)]


@pytest.mark.parametrize("augment,mixup,cutmix", [("crop", 0.0, 0.0), ("randaugment", 0.0, 0.0), ("flip", 0.4, 1.0)])
def test_pipeline_is_deterministic_given_a_seed(fashion, augment, mixup, cutmix):
    kw = dict(num_classes=10, image_size=32, channels=3, batch_size=32, training=True,
              augmentation=Augmentation(augment, mixup=mixup, cutmix=cutmix))
    a, b = batches(make_dataset(*fashion, seed=5, **kw)), batches(make_dataset(*fashion, seed=5, **kw))
    c = batches(make_dataset(*fashion, seed=6, **kw))
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a[0][0], c[0][0])
    x, y = a[0]
    assert x.shape == (32, 32, 32, 3) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 255
    np.testing.assert_allclose(x[..., 0], x[..., 2])  # gray repeated to RGB
    assert y.shape == (32, 10)
    np.testing.assert_allclose(y.sum(1), 1.0, rtol=1e-5)  # mixed labels still sum to one
    # Autotuning off: dropping an autotuned iterator (at every epoch start in fit) idled for seconds.
    assert make_dataset(*fashion, seed=5, **kw).options().autotune.enabled is False


def test_mixup_and_cutmix_both_used():
    """With both on, each batch draws one of them: CutMix copies pixels, MixUp blends them."""
    values = np.arange(64, dtype=np.uint8) * 4  # one constant value per image
    images = np.broadcast_to(values[:, None, None, None], (64, 8, 8, 1)).copy()
    dataset = make_dataset(images, np.arange(64) % 10, 10, batch_size=16, training=True, seed=3, repeat=True,
                           augmentation=Augmentation("none", mixup=0.8, cutmix=1.0))
    kinds = {bool(np.isin(x, values).all()) for x, _ in batches(dataset, 12)}
    assert kinds == {True, False}  # some batches cut and pasted, some blended


def erased_rectangles(x, background):
    """(whether any pixel of each image differs from the constant ``background``, and each image's mask of the
    changed pixels cropped to their bounding box, or None): a mask all True is one rectangle."""
    changed = np.abs(x[..., 0] - background) > 1e-3
    boxes = []
    for mask in changed:
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        box = mask[rows.min():rows.max() + 1, cols.min():cols.max() + 1] if rows.size else None
        boxes.append(box)
    return changed.any((1, 2)), boxes


@pytest.mark.parametrize("pipeline", ["tf.data", "numpy"])
def test_random_erasing_replaces_one_rectangle_of_some_images_in_training_only(pipeline):
    """Random erasing (Zhong et al.): each training image, with the probability asked, gets one rectangle of
    noise covering 2-40% of it; evaluation batches are untouched. Both pipelines draw the same distribution."""
    from vit_keras.data.array_pipeline import make_batches

    images, labels = np.full((512, 28, 28, 1), 100, np.uint8), np.arange(512) % 10
    kw = dict(num_classes=10, image_size=32, batch_size=512, augmentation=Augmentation("none", erase=0.5), seed=1)

    def first(training):
        if pipeline == "tf.data":
            return batches(make_dataset(images, labels, training=training, **kw), 1)[0][0]
        return make_batches(images, labels, training=training, **kw)[0][0]

    erased, boxes = erased_rectangles(first(True), 100.0)
    assert 0.4 < erased.mean() < 0.6
    areas = [box.size / 32**2 for box in boxes if box is not None]
    assert 0.15 < np.mean(areas) < 0.3 and max(areas) <= 0.45
    # Noise that equals the background by chance leaves a few holes; the box is still one rectangle.
    assert all(box.mean() > 0.98 for box in boxes if box is not None)
    np.testing.assert_allclose(first(False), 100.0, atol=1e-3)  # resized, not erased
    with pytest.raises(ValueError, match=r"`erase` must be in \[0, 1\]; got 1.5"):  # checked once, for both
        Augmentation(erase=1.5)


def test_eval_pipeline_keeps_order_and_pixels(fashion):
    images, labels = fashion
    dataset = make_dataset(images, labels, 10, batch_size=100, one_hot=False)
    x = np.concatenate([b[0] for b in batches(dataset, 3)])
    y = np.concatenate([b[1] for b in batches(dataset, 3)])
    np.testing.assert_array_equal(x, images.astype(np.float32))  # last partial batch kept, no augmentation
    np.testing.assert_array_equal(y, labels)


def test_full_crop_is_identity_and_bad_arguments(fashion):
    import tensorflow as tf

    x = tf.constant(fashion[0][:4].astype("float32"))
    same = random_resized_crop(x, (28, 28), (1.0, 1.0), tf.constant([1, 2], tf.int64), ratio=(1.0, 1.0))
    np.testing.assert_allclose(same.numpy(), x.numpy(), atol=1e-3)  # float32 rounding of the box, on 0-255
    with pytest.raises(ValueError, match="augment"):
        make_dataset(*fashion, num_classes=10, augmentation=Augmentation("rotate"))
    with pytest.raises(ValueError, match="one_hot"):
        make_dataset(*fashion, num_classes=10, augmentation=Augmentation(mixup=0.2), one_hot=False)
    for scale in ((0.0, 1.0), (0.8, 0.5), (0.5, 1.2), (0.5,)):
        with pytest.raises(ValueError, match="crop_scale"):
            make_dataset(*fashion, num_classes=10, augmentation=Augmentation(crop_scale=scale))
    with pytest.raises(ValueError, match=r"`labels` must be class indices in \[0, `num_classes`=5\)"):
        make_dataset(*fashion, num_classes=5)  # Fashion-MNIST has 10: one_hot would give all-zero targets
    with pytest.raises(ValueError, match="`mixup` must be >= 0"):
        make_dataset(*fashion, num_classes=10, augmentation=Augmentation(mixup=-0.5))
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        make_dataset(*fashion, num_classes=10, batch_size=2.5)


def test_enlarged_crops_keep_the_edges(fashion):
    """Crops scaled up sample up to half a pixel past the border: they must see the edge, not black."""
    import tensorflow as tf

    white = tf.fill((256, 28, 28, 1), 255.0)
    for size, scale in (((56, 56), (1.0, 1.0)), ((28, 28), (0.35, 1.0)), ((224, 224), (0.08, 1.0))):
        crops = random_resized_crop(white, size, scale, tf.constant([3, 4], tf.int64)).numpy()
        assert crops.min() > 254.99, (size, scale, crops.min())


def test_randaugment_draws_its_ops_per_image():
    same = np.repeat(np.random.default_rng(0).integers(0, 256, (1, 28, 28, 3), dtype=np.uint8), 16, axis=0)
    batch = next(iter(make_dataset(same, np.zeros(16, np.int64), 2, batch_size=16, training=True,
                                   augmentation=Augmentation("randaugment", crop_scale=(1.0, 1.0), flip=False))))[0].numpy()
    assert len({image.tobytes() for image in batch}) > 8  # one draw per batch made all 16 alike


# ---- folders laid out as train/ + val/ or validation/ + test/ -------------------------------------------------

def test_split_folders_are_used_as_given(tmp_path):
    make_folder(tmp_path / "set" / "train", classes=("cat", "dog", "eel"), per_class=6)
    make_folder(tmp_path / "set" / "test", classes=("cat", "dog", "eel"), per_class=2)
    spec = f"folder:{tmp_path / 'set'}"
    train, val, test = (vdata.load_dataset(spec, split) for split in ("train", "val", "test"))
    assert len(train.labels) == 18 and train.class_names == ["cat", "dog", "eel"]  # all of train/, no hold-out
    assert len(test.labels) == 6 and sorted(set(test.labels.tolist())) == [0, 1, 2]
    assert np.array_equal(val.images, test.images)  # no val/: validation reads test/, as Fashion-MNIST's does
    assert "train/" in train.source and "test/" in test.source
    make_folder(tmp_path / "set" / "validation", classes=("cat", "dog", "eel"), per_class=1)
    assert len(vdata.load_dataset(spec, "val").labels) == 3 and len(vdata.load_dataset(spec, "test").labels) == 6
    assert vdata.folder_image_size(str(tmp_path / "set")) is not None  # sizes from train/, not the split names


def test_a_lone_train_folder_holds_out_a_seeded_part(tmp_path):
    make_folder(tmp_path / "set" / "train", per_class=10)
    spec = f"folder:{tmp_path / 'set'}"
    train, val = (vdata.load_dataset(spec, split, val_fraction=0.2) for split in ("train", "val"))
    assert (len(train.labels), len(val.labels)) == (16, 4) and "held-out" in val.source


def test_split_folders_must_name_the_same_classes(tmp_path):
    make_folder(tmp_path / "set" / "train", classes=("cat", "dog"))
    make_folder(tmp_path / "set" / "test", classes=("cat", "eel"))
    with pytest.raises(ValueError, match=r"train/ has \['cat', 'dog'\], test/ has \['cat', 'eel'\]"):
        vdata.load_dataset(f"folder:{tmp_path / 'set'}", "test")


def test_an_empty_split_or_a_class_missing_from_one_is_clear(tmp_path, caplog):
    make_folder(tmp_path / "set" / "train", classes=("cat", "dog"))
    make_folder(tmp_path / "set" / "test", classes=("cat",), per_class=2)
    os.makedirs(tmp_path / "set" / "test" / "dog")  # the class is there, its images are not
    with caplog.at_level("WARNING"):
        test = vdata.load_dataset(f"folder:{tmp_path / 'set'}", "test")
    assert len(test.labels) == 2 and "no images of 1 class(es): dog" in caplog.text
    os.makedirs(tmp_path / "empty" / "train" / "cat")
    os.makedirs(tmp_path / "empty" / "train" / "dog")
    make_folder(tmp_path / "empty" / "val")
    with pytest.raises(ValueError, match="has no images"):
        vdata.load_dataset(f"folder:{tmp_path / 'empty'}", "train")


def test_whole_folder_reads_every_image(tmp_path):
    make_folder(tmp_path / "other", per_class=10)
    spec = f"folder:{tmp_path / 'other'}"
    whole = vdata.load_dataset(spec, "test", whole_folder=True)
    assert len(whole.labels) == 20 and whole.source == "the whole folder"
    assert len(vdata.load_dataset(spec, "test").labels) == 2  # without it, the seeded 10% held-out part
