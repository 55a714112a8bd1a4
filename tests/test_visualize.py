"""vit_keras.visualize: rollout, attention distance, position similarity, filter PCA, PNG writers, explain/inspect CLI."""

import math
import os

import numpy as np
import pytest
from PIL import Image

import vit_keras
from vit_keras import visualize


def tiny(**overrides):
    config = dict(image_size=28, patch_size=4, hidden_size=32, num_heads=2, mlp_dim=32, num_layers=2,
                  num_classes=3, channels=1, include_preprocessing=True)
    return vit_keras.VisionTransformer(**{**config, **overrides})


def random_attention(rng, layers, batch, heads, tokens):
    logits = rng.normal(size=(layers, batch, heads, tokens, tokens))
    weights = np.exp(logits)
    return list(weights / weights.sum(-1, keepdims=True))


# ----------------------------------------------------------------------------- rollout


def test_rollout_rows_sum_to_one_and_shape():
    maps = random_attention(np.random.default_rng(0), layers=3, batch=2, heads=4, tokens=5)
    rolled = visualize.attention_rollout(maps)
    assert rolled.shape == (2, 5, 5)
    np.testing.assert_allclose(rolled.sum(-1), 1.0, atol=1e-12)
    assert (rolled >= 0).all()


def test_rollout_hand_computed():
    # One head, two tokens: A = [[.5, .5], [0, 1]];  (A + I) renormalized = [[.75, .25], [0, 1]].
    layer = np.array([[[[0.5, 0.5], [0.0, 1.0]]]])
    np.testing.assert_allclose(visualize.attention_rollout([layer])[0], [[0.75, 0.25], [0.0, 1.0]])
    # Two such layers multiply: [[.75^2, .75 * .25 + .25], [0, 1]].
    np.testing.assert_allclose(visualize.attention_rollout([layer, layer])[0], [[0.5625, 0.4375], [0.0, 1.0]])
    # Heads are averaged: a head attending to itself and one attending across mean to [[.5, .5], [.5, .5]].
    heads = np.array([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])
    np.testing.assert_allclose(visualize.attention_rollout([heads], add_residual=False)[0], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="attention_maps"):
        visualize.attention_rollout([])


@pytest.mark.parametrize("pooling", ["token", "gap", "sequence"])
def test_heatmap_and_overlay_from_a_model(pooling):
    model = tiny(pooling=pooling)  # GAP and sequence pooling: no class token
    images = np.random.default_rng(0).integers(0, 256, (3, 28, 28, 1)).astype("uint8")
    heatmaps = visualize.attention_heatmap(model, images)
    assert heatmaps.shape == (3, 7, 7) and (heatmaps >= 0).all()
    if pooling == "token":  # the class token's rollout row over patches sums to 1 minus its self-share
        assert (heatmaps.sum(axis=(1, 2)) < 1).all()
    else:  # GAP, sequence pooling: a weighted mean of row-stochastic patch rows sums to 1
        np.testing.assert_allclose(heatmaps.sum(axis=(1, 2)), 1.0, atol=1e-5)
    overlay = visualize.overlay_heatmap(images[0], heatmaps[0])
    assert overlay.shape == (28, 28, 3) and overlay.dtype == np.uint8


def test_heatmap_gap_with_a_class_token_and_a_stem():
    model = tiny(pooling="gap", class_token=True, stem="conv", image_size=32, patch_size=8)  # conv stem, 4x4 grid
    heatmaps = visualize.attention_heatmap(model, np.zeros((2, 32, 32, 1)))
    assert heatmaps.shape == (2, 4, 4) and (heatmaps.sum(axis=(1, 2)) < 1).all()
    rolled = np.tile(np.eye(17), (1, 1, 1))
    with pytest.raises(ValueError, match="class_token"):
        visualize.rollout_heatmap(rolled, (4, 4), class_token=False, pooling="token")


def test_model_inputs_normalizes_only_without_preprocessing():
    images = np.full((1, 28, 28, 1), 255.0)
    assert visualize.model_inputs(tiny(), images).max() == 255.0
    assert visualize.model_inputs(tiny(include_preprocessing=False), images).max() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="images"):
        visualize.model_inputs(tiny(), np.zeros((1, 32, 32, 1)))


# ----------------------------------------------------------------------------- attention distance


def uniform_distance_3x3(cell):
    # Ordered pairs of a 3x3 grid: per axis, offset 0 occurs 3 times, 1 four times, 2 twice (9 pairs).
    # Sum over both axes of count * distance = 48 + 24 sqrt(2) + 16 sqrt(5), over 81 pairs.
    return cell * (48 + 24 * math.sqrt(2) + 16 * math.sqrt(5)) / 81


def neighbour_attention(grid):
    """Each patch attends uniformly to its 4-connected neighbours (no class token)."""
    gh, gw = grid
    weights = np.zeros((gh * gw, gh * gw))
    for r in range(gh):
        for c in range(gw):
            for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                if 0 <= r + dr < gh and 0 <= c + dc < gw:
                    weights[r * gw + c, (r + dr) * gw + c + dc] = 1
    return weights / weights.sum(-1, keepdims=True)


def test_attention_distance_local_vs_uniform_hand_computed():
    grid, cell = (3, 3), (4.0, 4.0)
    local = neighbour_attention(grid)[None, None]  # (B=1, heads=1, 9, 9)
    uniform = np.full((1, 1, 9, 9), 1 / 9)
    itself = np.eye(9)[None, None]
    distances = visualize.mean_attention_distance([itself, local, uniform], grid, cell, class_token=False)
    assert distances.shape == (3, 1)
    np.testing.assert_allclose(distances[:, 0], [0.0, 4.0, uniform_distance_3x3(4.0)], rtol=1e-12)
    assert uniform_distance_3x3(4.0) == pytest.approx(5.8133, abs=1e-4)


def test_attention_distance_leaves_out_the_class_token():
    # 10 tokens: half of every patch's attention goes to the class token, half to a neighbour 4 px away.
    weights = np.zeros((1, 2, 10, 10))
    weights[..., 0] = 0.5
    weights[..., 1:, 1:] = 0.5 * neighbour_attention((3, 3))
    weights[..., 0, :] = 0.1  # the class token's own row is ignored
    renormalized = visualize.mean_attention_distance([weights], (3, 3), (4.0, 4.0), class_token=True)
    raw = visualize.mean_attention_distance([weights], (3, 3), (4.0, 4.0), class_token=True, renormalize=False)
    np.testing.assert_allclose(renormalized, [[4.0, 4.0]])
    np.testing.assert_allclose(raw, [[2.0, 2.0]])


def test_attention_distance_rectangular_cells_and_model():
    distances = visualize.patch_distances((2, 3), (4.0, 8.0))
    assert distances[0, 1] == 8.0 and distances[0, 3] == 4.0 and distances[0, 5] == pytest.approx(math.hypot(4, 16))
    model = tiny(image_size=(28, 20), class_token=False, pooling="gap")
    values = visualize.attention_distance(model, np.zeros((2, 28, 20, 1)))
    assert values.shape == (2, 2)
    assert ((values > 0) & (values < math.hypot(24, 16))).all()


# ----------------------------------------------------------------------------- embeddings


@pytest.mark.parametrize("position", ["learned", "learned_2d", "sincos_2d"])
@pytest.mark.parametrize("class_token", [True, False])
def test_position_similarity_diagonal_and_symmetry(position, class_token):
    model = tiny(image_size=(28, 20), position_embedding=position, class_token=class_token,
                 pooling="token" if class_token else "gap")
    similarity = visualize.position_similarity(model)
    assert similarity.shape == (7, 5, 7, 5)
    flat = similarity.reshape(35, 35)
    np.testing.assert_allclose(np.diagonal(flat), 1.0, atol=1e-6)
    np.testing.assert_allclose(flat, flat.T, atol=1e-6)
    assert (np.abs(flat) <= 1 + 1e-6).all()


def test_position_similarity_needs_a_position_embedding():
    with pytest.raises(ValueError, match="position_embedding='none'"):
        visualize.position_similarity(tiny(position_embedding="none"))


@pytest.mark.parametrize("channels,expected", [(1, 16), (3, 28)])
def test_embedding_components_shapes(channels, expected):
    model = tiny(channels=channels)  # kernel (4, 4, C, 32): 16*C values per filter, 32 filters
    components, ratio = visualize.embedding_components(model)
    assert components.shape == (expected, 4, 4, channels)
    flat = components.reshape(expected, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(expected), atol=1e-6)  # orthonormal
    assert (np.diff(ratio) <= 1e-12).all() and 0 < ratio.sum() <= 1 + 1e-9


def test_plot_writers_write_pngs(tmp_path):
    model = tiny(channels=3, image_size=32)
    images = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3))
    components, ratio = visualize.embedding_components(model)
    paths = [
        visualize.plot_attention_overlay(images[0], visualize.attention_heatmap(model, images)[0], tmp_path / "o.png"),
        visualize.plot_attention_distance({"a": np.ones((2, 2)), "b": np.zeros((2, 2))}, tmp_path / "d.png"),
        visualize.plot_position_similarity(visualize.position_similarity(model), tmp_path / "s.png"),
        visualize.plot_embedding_components(components, tmp_path / "f.png", ratio),
    ]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and min(image.size) > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "f.png", "o.png", "s.png"]  # no temp files left


# ----------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    tiny().save(folder / "model.keras")
    (folder / "labels.txt").write_text("a\nb\nc\n")
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(folder / "x.png")
    return folder


def test_explain_cli_writes_overlay(saved_model, tmp_path, capsys):
    from vit_keras.apps.cli import main

    assert main(["explain", str(saved_model / "model.keras"), str(saved_model / "x.png"), "--out", str(tmp_path)]) == 0
    with Image.open(tmp_path / "x_attention.png") as image:
        assert image.format == "PNG"
    assert "x_attention.png" in capsys.readouterr().out
    assert main(["explain", str(saved_model / "model.keras"), str(tmp_path / "missing.png"), "--out",
                 str(tmp_path)]) == 2
    (tmp_path / "b").mkdir()
    Image.open(saved_model / "x.png").rotate(90, expand=True).save(tmp_path / "b" / "x.png")
    assert main(["explain", str(saved_model / "model.keras"), str(saved_model / "x.png"), str(tmp_path / "b" / "x.png"),
                 "--out", str(tmp_path / "out")]) == 0  # two x.png from two folders: two overlays
    assert sorted(os.listdir(tmp_path / "out")) == ["x_1_attention.png", "x_attention.png"]
    from vit_keras.apps.commands.explain import output_names

    assert output_names(["x/a.png", "y/a.png", "a_1.jpg"]) == ["a_attention.png", "a_1_attention.png",
                                                                "a_1_1_attention.png"]
    (tmp_path / "bad.png").write_bytes(b"not a png")
    capsys.readouterr()
    assert main(["explain", str(saved_model / "model.keras"), str(tmp_path / "bad.png"), "--out", str(tmp_path)]) == 2
    assert "not a readable image" in capsys.readouterr().err


def test_inspect_cli_writes_figures(saved_model, tmp_path):
    from vit_keras.apps.cli import main

    code = main(["inspect", str(saved_model / "model.keras"), "--out", str(tmp_path), "--limit", "16"])
    assert code == 0
    for name in ("attention_distance.png", "position_similarity.png", "embedding_filters.png"):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG"
    assert (tmp_path / "inspect.json").exists()
