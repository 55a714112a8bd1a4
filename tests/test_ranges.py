"""int8 activation ranges (convert/ranges.py): the least-error range of a histogram, and of a real graph."""

import numpy as np
import pytest

import vit_keras
import keras

from vit_keras.convert import export as tflite_export
from vit_keras.convert import tflite
from vit_keras.convert.ranges import BINS, LEVELS, best_range


def histogram(values, low, high):
    return np.histogram(values, bins=BINS, range=(low, high))[0]


def test_a_rare_outlier_is_clipped_and_a_plain_range_is_kept():
    rng = np.random.default_rng(0)
    bulk = rng.uniform(-1, 1, 1_000_000)
    assert best_range(histogram(bulk, -1, 1), -1, 1) == pytest.approx((-1, 1), abs=0.03)
    # One value in a million stretches min/max's step 5.5x: clipping it costs less than that step's rounding.
    with_outlier = np.append(bulk, 10.0)
    low, high = best_range(histogram(with_outlier, -1, 10), -1, 10)
    assert low == pytest.approx(-1, abs=0.05) and high < 5
    # A hundred such values are no longer rare: their clipping would cost more, and the range keeps them.
    assert best_range(histogram(np.append(bulk, np.full(100, 10.0)), -1, 10), -1, 10)[1] > 9


def test_a_heavy_tail_keeps_most_of_its_range():
    """A Gaussian's min and max are its rarest values; the least-error range clips them, but only a little of the
    mass: the clipped share stays under a percent and the step is smaller than min/max's."""
    values = np.random.default_rng(1).standard_normal(200_000)
    low, high = values.min(), values.max()
    lo, hi = best_range(histogram(values, low, high), low, high)
    assert low < lo < 0 < hi < high
    assert np.mean((values < lo) | (values > hi)) < 0.01
    step = (hi - lo) / LEVELS
    error = np.mean(np.where(values > hi, (values - hi) ** 2, np.where(values < lo, (lo - values) ** 2, step ** 2 / 12)))
    assert error < ((high - low) / LEVELS) ** 2 / 12


def test_mse_ranges_narrow_the_calibrated_graph_and_stay_close_to_keras(tmp_path):
    """The refined graph keeps every range inside min/max's (with 0 in it), the input's [0, 255], and its int8 file
    agrees with Keras as the min/max one does."""
    from ai_edge_litert import schema_py_generated as schema

    from vit_keras.convert.graph import keras_scores
    from vit_keras.convert.runtime import tflite_scores

    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", image_size=28, channels=1, patch_size=7, num_classes=4, num_layers=1,
                                   hidden_size=32, num_heads=2, mlp_dim=64, include_preprocessing=True)
    images = np.random.default_rng(0).integers(0, 256, (120, 28, 28, 1), dtype=np.uint8)
    graphs = {name: tflite.convert_graph(model, "int8", images, ranges=name) for name in ("minmax", "mse")}
    tensors = {name: schema.ModelT.InitFromPackedBuf(bytearray(data), 0).subgraphs[0].tensors
               for name, data in graphs.items()}
    narrowed = 0
    for before, after in zip(tensors["minmax"], tensors["mse"]):
        if before.quantization is None or before.quantization.min is None:
            continue
        (lo0, hi0), (lo1, hi1) = ((float(t.quantization.min[0]), float(t.quantization.max[0])) for t in (before, after))
        if before.name in (b"image", b"Identity"):  # the graph's input and output keep theirs
            assert (lo1, hi1) == (lo0, hi0)
            continue
        assert min(lo0, 0) - 1e-6 <= lo1 <= 0 <= hi1 <= max(hi0, 0) + 1e-6, before.name
        narrowed += (lo1, hi1) != (min(lo0, 0), max(hi0, 0))
    assert narrowed > 5
    reference = keras_scores(model, images[:40])
    for name in graphs:
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(tflite.convert(model, "int8", images, ranges=name, activations="static"))
        assert np.abs(tflite_scores(path, images[:40]) - reference).max() < 0.08, name
