"""faustomorales/vit-keras's API (``vit_keras.vit``, ``utils``, ``visualize.attention_map``) on this package.

The README's examples run as written there, with ``pretrained=False`` (and so ``pretrained_top=False``, which
their contract requires with it) and a local image instead of a URL; their save test runs unchanged.
"""

import io
import os
import socket

import numpy as np
import pytest
from PIL import Image

from vit_keras import vit, utils, visualize  # the old package's import line
from vit_keras.models.vision_transformer import VisionTransformer
from vit_keras.factory import create_model
from vit_keras.weights.loader import model_arrays
from vit_keras.weights.fetch import DownloadError, cache_path


@pytest.fixture
def photo(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "photo.png"
    Image.fromarray(rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture
def closed_port():
    """A localhost port nobody listens on: a real connection that is refused, as offline."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_submodules_import():
    import vit_keras
    import vit_keras.compat.vit

    assert vit_keras.vit is vit_keras.compat.vit is vit  # the old module name still reaches the old API
    with pytest.raises(AttributeError, match="create_model"):
        vit_keras.vit_b16  # noqa: B018  (one name, one meaning: the library builds named models with create_model)
    assert callable(utils.get_imagenet_classes) and callable(visualize.attention_map)


def test_imagenet_classes_in_the_standard_order():
    classes = utils.get_imagenet_classes()
    assert len(classes) == 1000 and all(classes)
    known = {0: "tench", 1: "goldfish", 2: "great white shark", 207: "golden retriever", 248: "Eskimo dog",
             281: "tabby", 409: "analog clock", 948: "Granny Smith", 999: "toilet tissue"}
    for index, first_name in known.items():
        assert classes[index].split(",")[0] == first_name, index


def test_readme_examples(photo):
    """Usage and "Visualizing Attention Maps" from their README (ViT-B/16 at 224 instead of 384)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image_size = 224
    classes = utils.get_imagenet_classes()
    model = vit.vit_b16(
        image_size=image_size,
        activation='sigmoid',
        pretrained=False,
        include_top=True,
        pretrained_top=False
    )
    image = utils.read(photo, image_size)
    X = vit.preprocess_inputs(image).reshape(1, image_size, image_size, 3)
    y = model.predict(X)
    assert classes[y[0].argmax()] in classes
    assert y.shape == (1, 1000) and ((y > 0) & (y < 1)).all()  # sigmoid
    np.testing.assert_allclose(X[0], image / 127.5 - 1, atol=1e-6)
    assert vit.vision_transformer_of(model).count_params() == 86_567_656  # ViT-B/16 with a 1000-class head

    attention_map = visualize.attention_map(model=model, image=image)
    print('Prediction:', classes[
        model.predict(vit.preprocess_inputs(image)[np.newaxis])[0].argmax()]
    )
    fig, (ax1, ax2) = plt.subplots(ncols=2)
    ax1.axis('off')
    ax2.axis('off')
    ax1.set_title('Original')
    ax2.set_title('Attention Map')
    _ = ax1.imshow(image)
    _ = ax2.imshow(attention_map)
    plt.close(fig)
    assert attention_map.shape == image.shape and attention_map.dtype == np.uint8
    assert (attention_map <= image).all() and attention_map.max() > 0


def test_readme_fine_tune_model_builds():
    image_size = 224
    model = vit.vit_l32(
        image_size=image_size,
        activation='sigmoid',
        pretrained=False,
        include_top=True,
        pretrained_top=False,
        classes=200
    )
    inner = vit.vision_transformer_of(model)
    assert model.output_shape == (None, 200) and model.input_shape == (None, 224, 224, 3)
    assert {k: inner.vit_config[k] for k in ("patch_size", "hidden_size", "num_layers", "mlp_dim", "num_heads")} == \
        dict(patch_size=32, hidden_size=1024, num_layers=24, mlp_dim=4096, num_heads=16)
    assert inner.vit_config["dropout"] == 0.1 and inner.vit_config["representation_size"] is None


@pytest.mark.slow
def test_saving(tmp_path, monkeypatch):
    """Their tests/test_save.py as written (tf.keras is Keras 3 here), then both files reloaded."""
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    inp = tf.keras.layers.Input(shape=(256, 256, 3))
    base = vit.vit_b16(  # type: ignore
        image_size=256,
        pretrained=False,
        include_top=False,
        pretrained_top=False,
    )
    x = base(inp)
    x = tf.keras.layers.Dense(64, activation="relu")(x)
    x = tf.keras.layers.Dense(5, activation="softmax")(x)
    model = tf.keras.Model(inputs=inp, outputs=x)
    opt = tf.keras.optimizers.Adam()
    loss = tf.keras.losses.CategoricalCrossentropy()
    model.compile(optimizer=opt, loss=loss, metrics=["categorical_accuracy"])
    model.save("weights.h5")
    tf.saved_model.save(model, "weights")

    images = np.random.default_rng(1).uniform(-1, 1, (2, 256, 256, 3)).astype("float32")
    expected = model.predict(images, verbose=0)
    reloaded = tf.keras.models.load_model("weights.h5")
    assert isinstance(reloaded.layers[1], VisionTransformer)
    np.testing.assert_allclose(reloaded.predict(images, verbose=0), expected, atol=1e-5)
    serving = tf.saved_model.load("weights").signatures["serving_default"]
    (served,) = serving(tf.constant(images)).values()
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-5)


def test_weights_urls_are_the_old_packages():
    """Their tests/test_urls.py builds the download URLs from these names (it needs the network to fetch them)."""
    urls = {f"{vit.BASE_URL}/ViT-{size}_{weights}.npz" for weights in vit.WEIGHTS for size in vit.SIZES}
    assert urls == {vit.weights_url(size, weights) for weights in vit.WEIGHTS for size in vit.SIZES}
    assert len(urls) == 8 and vit.WEIGHTS == {"imagenet21k": 21_843, "imagenet21k+imagenet2012": 1_000}


@pytest.mark.parametrize("kwargs, message", [
    (dict(pretrained=False), "`pretrained_top`=True needs `pretrained`=True"),
    (dict(include_top=False), "`pretrained_top`=True needs `include_top`=True"),
    (dict(classes=10), "has 1000 classes; got `classes`=10"),
    (dict(weights="imagenet21k", classes=1000), "has 21843 classes; got `classes`=1000"),
    (dict(weights="imagenet", pretrained_top=False), "`weights` must be one of 'imagenet21k', "),
    (dict(pretrained="yes", pretrained_top=False), "`pretrained` must be True or False"),
    (dict(activation="nope", pretrained=False, pretrained_top=False), "`activation` must be a Keras activation"),
    (dict(image_size=100, pretrained=False, pretrained_top=False), "image_size"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        vit.vit_b32(**kwargs)


def test_pretrained_offline_error(tmp_path, monkeypatch, closed_port):
    monkeypatch.setenv("VIT_KERAS_CACHE", str(tmp_path))
    monkeypatch.setattr(vit, "BASE_URL", f"http://127.0.0.1:{closed_port}/dl")
    url = f"http://127.0.0.1:{closed_port}/dl/ViT-B_32_imagenet21k+imagenet2012.npz"
    with pytest.raises(DownloadError) as error:
        vit.vit_b32(image_size=32)
    message = str(error.value)
    assert f"`pretrained`=True could not download {url}" in message and "offline" in message
    assert cache_path(url) in message and "load_weights_numpy" in message
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing half-written in the cache


@pytest.mark.slow
def test_pretrained_loads_the_cached_google_file(tmp_path, monkeypatch):
    """pretrained=True reads the old package's file from our cache; pretrained_top=False leaves its head out."""
    monkeypatch.setenv("VIT_KERAS_CACHE", str(tmp_path))
    source = vit.vit_b32(image_size=32, pretrained=False, pretrained_top=False)
    path = cache_path(vit.weights_url("B_32", "imagenet21k+imagenet2012"))
    os.makedirs(os.path.dirname(path))
    np.savez(path, **model_arrays(source))  # Google's names, as in their file
    images = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")

    model = vit.vit_b32(image_size=32)  # pretrained and pretrained_top by default
    np.testing.assert_allclose(model.predict(images, verbose=0), source.predict(images, verbose=0), atol=1e-5)

    with pytest.warns(UserWarning, match="head"):  # pretrained_top=False and another class count
        tuned = vit.vit_b32(image_size=32, pretrained_top=False, classes=7, activation="sigmoid")
    inner = vit.vision_transformer_of(tuned)
    np.testing.assert_array_equal(inner.patch_encoder.get_weights()[0], source.patch_encoder.get_weights()[0])
    np.testing.assert_allclose(tuned.predict(images, verbose=0), np.full((2, 7), 0.5), atol=1e-6)  # zero head


def test_attention_map_masks_the_image():
    model = create_model("vit_ti16", image_size=32, num_layers=2)
    image = np.full((40, 56, 3), 255, np.uint8)  # another size than the model's: resized both ways
    masked = visualize.attention_map(model, image)
    assert masked.shape == image.shape and masked.dtype == np.uint8 and masked.max() >= 250
    heatmap = visualize.attention_heatmap(model, np.full((1, 32, 32, 3), 255.0))[0]  # 2 x 2 patches
    quadrants = masked[..., 0].reshape(2, 20, 2, 28).mean(axis=(1, 3))
    assert np.unravel_index(quadrants.argmax(), (2, 2)) == np.unravel_index(heatmap.argmax(), (2, 2))

    grey = visualize.attention_map(model, image[..., 0])
    assert grey.shape == (40, 56)
    np.testing.assert_array_equal(grey, masked[..., 0])
    with pytest.raises(ValueError, match="`image` must be"):
        visualize.attention_map(model, np.zeros((4, 4, 2)))


def test_attention_map_of_a_wrapped_model():
    """A model with an activation wraps its VisionTransformer; the map is the inner model's."""
    wrapped = vit.build_model(image_size=32, patch_size=16, num_layers=2, hidden_size=32, num_heads=2, name="tiny",
                              mlp_dim=64, classes=3, activation="softmax")
    inner = vit.vision_transformer_of(wrapped)
    assert isinstance(inner, VisionTransformer) and not isinstance(wrapped, VisionTransformer)
    image = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    np.testing.assert_array_equal(visualize.attention_map(wrapped, image), visualize.attention_map(inner, image))
    np.testing.assert_allclose(wrapped.predict(vit.preprocess_inputs(image)[None], verbose=0).sum(), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="VisionTransformer"):
        vit.vision_transformer_of(object())


def test_read_sources_and_errors(photo, closed_port):
    from_path = utils.read(photo, 64)
    assert from_path.shape == (64, 64, 3) and from_path.dtype == np.uint8
    with open(photo, "rb") as f:
        np.testing.assert_array_equal(utils.read(io.BytesIO(f.read()), 64), from_path)
    pil = Image.open(photo)
    np.testing.assert_array_equal(utils.read(pil, (64, 64)), from_path)
    grey = utils.read(pil.convert("L"), (48, 32))
    assert grey.shape == (48, 32, 3) and (grey[..., 0] == grey[..., 2]).all()
    with pytest.raises(ValueError, match="`size` must be"):
        utils.read(photo, 0)
    with pytest.raises(FileNotFoundError, match="no image file"):
        utils.read(photo + ".missing", 64)
    with pytest.raises(ValueError, match="not a readable image"):
        utils.read(io.BytesIO(b"not an image"), 64)
    with pytest.raises(ConnectionError, match="Could not download the image .* offline"):
        utils.read(f"http://127.0.0.1:{closed_port}/photo.jpg", 64, timeout=5)


def test_preprocess_inputs():
    from keras import ops

    pixels = np.array([[0, 127.5, 255]], "uint8")
    np.testing.assert_allclose(vit.preprocess_inputs(pixels), [[-1, 0, 1]], atol=1e-2)
    assert isinstance(vit.preprocess_inputs([0.0, 255.0]), np.ndarray)
    tensor = vit.preprocess_inputs(ops.convert_to_tensor([0.0, 255.0]))
    assert ops.is_tensor(tensor)
    np.testing.assert_allclose(ops.convert_to_numpy(tensor), [-1, 1])
