"""Pretrained weights: every layout loads and computes what the reference (timm / Hugging Face) computes.

The fixtures come from scripts/make_weight_fixtures.py (run once with torch, timm and
transformers); see its docstring. Logits must agree to 1e-4 (float32).
"""

import functools
import hashlib
import os
import shutil

import numpy as np
import pytest

import vit_keras
import weight_checkpoints as wc
from weight_server import WeightServer
from vit_keras.models import position
from vit_keras.weights import loader as weights
from vit_keras.weights.fetch import DownloadError
from vit_keras.weights.torch import canonical_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, wc.FIXTURES)
TOLERANCE = 1e-4


@functools.lru_cache(maxsize=1)
def expected():
    with np.load(os.path.join(FIXTURES, "expected.npz")) as data:
        return {k: data[k] for k in data.files}


def fixture(name):
    return os.path.join(FIXTURES, name)


def check_logits(model, case, size):
    ref = expected()[f"{case}/logits"]
    x = wc.images(size, int(expected()[f"{case}/image_seed"]))
    diff = float(np.abs(np.asarray(model(x)) - ref).max())
    print(f"{case}: max |keras - reference| = {diff:.2e}")
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff}"
    return diff


def build(name="vit_b16", **kwargs):
    """A model fed normalized images, as the reference implementations are."""
    return vit_keras.create_model(name, **{"include_preprocessing": False, **kwargs})


AUGREG = dict(image_size=64, patch_size=16, hidden_size=48, num_heads=3, mlp_dim=96, num_layers=3, num_classes=7)
PRE_LOGITS = dict(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2,
                  num_classes=10, representation_size=64)


def test_google_original_layout_with_pre_logits_matches_timm(tmp_path):
    model = build(weights=fixture("google_vit_pre_logits.npz"), **PRE_LOGITS)
    check_logits(model, "google_vit_pre_logits", 32)
    # round trip: npz -> Keras -> npz gives back the very same arrays, plus the grid record
    saved = weights.save_npz(model, tmp_path / "again.npz")
    with np.load(fixture("google_vit_pre_logits.npz")) as a, np.load(saved) as b:
        assert sorted(b.files) == sorted([*a.files, weights.GRID]) and list(b[weights.GRID]) == [4, 4]
        for name in a.files:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("size", [64, (96, 80), (48, 48)])
def test_augreg_layout_at_its_own_and_other_resolutions(size, tmp_path):
    """Other sizes resample the position embedding like timm's checkpoint_filter_fn (bicubic, antialias)."""
    model = build(weights=fixture("google_augreg.npz"), **{**AUGREG, "image_size": size})
    case = "google_augreg" if size == 64 else f"google_augreg_{size[0]}x{size[1]}"
    check_logits(model, case, size)
    if size == 64:
        saved = weights.save_npz(model, tmp_path / "again.npz")
        with np.load(fixture("google_augreg.npz")) as a, np.load(saved) as b:
            assert sorted(b.files) == sorted([*a.files, weights.GRID])
            assert all(np.array_equal(a[n], b[n]) for n in a.files)


def test_big_vision_scanned_with_class_token():
    model = build("vit_s16", image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2,
                  num_classes=5, weights=fixture("big_vision_scan.npz"))
    check_logits(model, "big_vision_scan", 32)


def test_big_vision_unscanned_gap_patch14():
    model = build("vit_h14", image_size=42, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2,
                  num_classes=4, pooling="gap", weights=fixture("big_vision_gap.npz"))
    check_logits(model, "big_vision_gap", 42)


@pytest.mark.parametrize("name,model_name", [("hybrid_r26_s32", "vit_r26_s32"), ("hybrid_r50_b16", "vit_r50_b16")])
def test_hybrid_layouts_match_timm(name, model_name, tmp_path):
    arrays = wc.hybrid_checkpoint(name)
    assert wc.arrays_sha256(arrays) == str(expected()[f"{name}/sha256"]), "regenerated checkpoint drifted"
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    model = build(model_name, weights=str(path), **wc.HYBRIDS[name]["config"])
    check_logits(model, name, wc.HYBRIDS[name]["config"]["image_size"])
    again = weights.model_arrays(model)
    assert sorted(again) == sorted(arrays) and all(np.array_equal(arrays[n], again[n]) for n in arrays)
    check_timm_hybrid_names(name, arrays)


def check_timm_hybrid_names(name, arrays):
    """timm's hybrid state dict (its names and shapes, plus a few real tensors) maps onto the Google layout."""
    state = {}
    for entry in expected()[f"{name}/timm_keys"]:
        key, shape = str(entry).split("|")
        state[key] = np.zeros([int(n) for n in shape.split(",") if n], np.float32)
    samples = {k[len(f"{name}/timm/"):]: v for k, v in expected().items() if k.startswith(f"{name}/timm/")}
    state.update(samples)
    canonical = canonical_torch(state, num_heads=wc.HYBRIDS[name]["config"]["num_heads"])
    assert canonical.timm_table and canonical.grid is None  # a timm table: the loader decides its class row
    assert {k: v.shape for k, v in canonical.items()} == {k: v.shape for k, v in arrays.items()}
    mapped = [n for n in canonical if np.any(canonical[n])]
    assert len(mapped) == len(samples)
    for n in mapped:
        assert np.array_equal(canonical[n], arrays[n]), n


def test_timm_safetensors():
    model = build(image_size=48, patch_size=16, hidden_size=64, num_heads=2, mlp_dim=128, num_layers=2,
                  num_classes=6, weights=fixture("timm_vit.safetensors"))
    check_logits(model, "timm_vit", 48)


def test_hugging_face_classifier_safetensors():
    eps = float(expected()["hf_vit_classifier/layer_norm_eps"])  # HF's ViTConfig default, 1e-12
    model = build(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2,
                  num_classes=10, norm_epsilon=eps, weights=fixture("hf_vit_classifier.safetensors"))
    check_logits(model, "hf_vit_classifier", 32)


def test_hugging_face_vit_model_pooler_is_pre_logits():
    eps = float(expected()["hf_vit_model/layer_norm_eps"])
    model = build(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1,
                  include_top=False, representation_size=32, norm_epsilon=eps,
                  weights=fixture("hf_vit_model.safetensors"))
    check_logits(model, "hf_vit_model", 32)


# ---- mismatches -------------------------------------------------------------------------------------------

def snapshot(model):
    return [np.array(w) for w in model.get_weights()]


def test_wrong_shapes_list_every_name_and_load_nothing():
    model = build(**{**AUGREG, "mlp_dim": 64, "num_layers": 2})
    before = snapshot(model)
    with pytest.raises(ValueError) as info:
        weights.load_weights(model, fixture("google_augreg.npz"))
    message = str(info.value)
    for i in range(2):
        for name in ("Dense_0/kernel", "Dense_0/bias", "Dense_1/kernel"):
            assert f"shape mismatch: Transformer/encoderblock_{i}/MlpBlock_3/{name}" in message
    assert message.count("unexpected in checkpoint: Transformer/encoderblock_2/") == 16
    assert "(6 shape mismatches, 0 missing, 16 unexpected)" in message
    assert "Hint: the checkpoint has 3 encoder blocks and the model 2: use num_layers=3" in message
    assert all(np.array_equal(a, b) for a, b in zip(before, snapshot(model))), "model was partly loaded"


def test_other_num_classes_skips_head_with_warning():
    model = build(**{**AUGREG, "num_classes": 3})
    with pytest.warns(UserWarning, match="Skipping the checkpoint's head: it has 7 classes and the model 3"):
        weights.load_weights(model, fixture("google_augreg.npz"))
    with np.load(fixture("google_augreg.npz")) as ckpt:
        assert np.array_equal(model.get_layer("embedding").kernel.numpy(), ckpt["embedding/kernel"])
    assert all(not np.any(w) for w in snapshot(model)[-2:])  # the paper's zero-initialized head


def test_pre_logits_needs_representation_size_unless_head_is_replaced():
    config = {**PRE_LOGITS, "representation_size": None}
    with pytest.raises(ValueError, match="unexpected in checkpoint: pre_logits/kernel(.|\n)*representation_size"):
        build(weights=fixture("google_vit_pre_logits.npz"), **config)
    with pytest.warns(UserWarning) as caught:
        build(weights=fixture("google_vit_pre_logits.npz"), **{**config, "num_classes": 4})
    messages = " | ".join(str(w.message) for w in caught)
    assert "Skipping the checkpoint's head" in messages and "Skipping the checkpoint's pre_logits" in messages


def test_hybrid_checkpoint_into_plain_vit_says_so(tmp_path):
    with np.load(fixture("google_augreg.npz")) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["conv_root/kernel"] = np.zeros((7, 7, 3, 64), np.float32)
    np.savez(tmp_path / "hybrid.npz", **arrays)
    with pytest.raises(ValueError, match="unexpected in checkpoint: conv_root/kernel") as info:
        build(weights=str(tmp_path / "hybrid.npz"), **AUGREG)
    assert "Hint: the checkpoint is a hybrid" in str(info.value)


@pytest.mark.parametrize("prefix", ["opt/target/", "params/img/"])
def test_other_prefixes_read_like_the_plain_layout(prefix, tmp_path):
    source = "google_augreg.npz" if prefix == "opt/target/" else "big_vision_scan.npz"
    with np.load(fixture(source)) as data:
        arrays = {k: data[k] for k in data.files}
    renamed = {prefix + k.removeprefix("params/"): v for k, v in arrays.items()}
    renamed["opt/state/step" if prefix == "opt/target/" else "params/txt/Encoder_0/scale"] = np.zeros(3, np.float32)
    np.savez(tmp_path / "prefixed.npz", **renamed)
    got = weights.read_checkpoint(str(tmp_path / "prefixed.npz"), num_heads=2)
    want = weights.read_checkpoint(fixture(source), num_heads=2)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("options", [
    dict(patch_size=32, image_size=64),                                  # a /32 model
    dict(position_embedding="learned_2d"),
    dict(position_embedding="sincos_2d", pooling="gap"),
    dict(stem="conv", patch_size=8),
    dict(include_top=False, representation_size=16),
    dict(pooling="sequence"),
    dict(locality_attention=True),
])
def test_save_then_load_round_trips_every_option(options, tmp_path):
    config = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1,
                  num_classes=3, **{k: v for k, v in options.items() if k not in ("image_size", "patch_size")})
    config.update({k: options[k] for k in ("image_size", "patch_size") if k in options})
    source = build(**config)
    path = weights.save_npz(source, tmp_path / "m.npz")
    copy = build(**config, weights=str(path))
    x = wc.images(config["image_size"], 5)
    assert np.array_equal(np.asarray(source(x)), np.asarray(copy(x)))
    again = weights.model_arrays(copy)
    with np.load(path) as saved:
        assert sorted(saved.files) == sorted([*again, weights.GRID])
        assert all(np.array_equal(saved[k], again[k]) for k in again)


def test_sequence_pooling_weights_start_afresh_where_the_checkpoint_has_none(tmp_path):
    """A GAP checkpoint into a sequence-pooled model (and back): everything else loads, the readout's token
    scores keep their initial values, with a warning each way."""
    config = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, num_classes=3)
    gap = weights.save_npz(build(**config, pooling="gap"), tmp_path / "gap.npz")
    fresh = build(**config, pooling="sequence")
    initial = [np.asarray(w) for w in fresh.pooling_layer.score.get_weights()]
    with pytest.warns(UserWarning, match="no sequence-pooling weights"):
        weights.load_weights(fresh, str(gap))
    assert all(np.array_equal(a, b) for a, b in zip(initial, fresh.pooling_layer.score.get_weights()))
    np.testing.assert_array_equal(np.asarray(fresh.encoder_norm.gamma), weights.read_checkpoint(
        str(gap), num_heads=2)["Transformer/encoder_norm/scale"])
    pooled = weights.save_npz(fresh, tmp_path / "sequence.npz")
    with pytest.warns(UserWarning, match="Skipping the checkpoint's sequence-pooling weights"):
        build(**config, pooling="gap", weights=str(pooled))


TINY = dict(patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, num_classes=3)


@pytest.mark.parametrize("position_embedding", ["learned", "learned_2d"])
def test_saved_grid_is_resampled_even_where_the_token_counts_agree(position_embedding, tmp_path):
    """A 16:9-like grid's table (3x5 here) says nothing of its shape: save_npz records the grid, so loading at
    another size resamples exactly as resize_model does, and a 2x8 file into a 4x4 model (16 tokens each)."""
    for old, new in [((24, 40), (32, 32)), ((16, 64), (32, 32))]:
        source = build(image_size=old, position_embedding=position_embedding, **TINY)
        path = weights.save_npz(source, tmp_path / "m.npz")
        loaded = build(image_size=new, position_embedding=position_embedding, weights=str(path), **TINY)
        resized = vit_keras.resize_model(source, new)
        for a, b in zip(loaded.get_layer("embedding").weights, resized.get_layer("embedding").weights):
            assert np.allclose(np.asarray(a), np.asarray(b), atol=1e-6), (old, new, a.path)


def test_timm_table_without_class_row_and_rectangular_grids(tmp_path):
    """timm's tables: a class row on a 3x5 grid (16 rows, a square count) is not mistaken for a row-less 4x4
    table; a row-less table (no_embed_class) gets a zero class row, at the same grid or resampled."""
    import safetensors.numpy

    state = safetensors.numpy.load_file(fixture("timm_vit.safetensors"))
    config = dict(patch_size=16, hidden_size=64, num_heads=2, mlp_dim=128, num_layers=2, num_classes=6)
    table = np.random.default_rng(0).normal(size=(1, 16, 64)).astype(np.float32)
    for rows, size, want in [(table, (48, 80), table),                                # class row + 3x5
                             (table[:, 1:], (48, 80), None),                         # 3x5, no class row
                             (table[:, 1:10], (48, 48), None),                       # 3x3, no class row
                             (table[:, 1:10], (64, 64), None)]:                      # 3x3 -> 4x4
        path = tmp_path / "timm.safetensors"
        safetensors.numpy.save_file({**state, "pos_embed": rows}, str(path))
        got = np.asarray(build(image_size=size, weights=str(path), **config).get_layer("embedding").pos_embedding)
        if want is None:  # a zero class row, then the grid resampled where the model's differs
            old, new = (3, 5) if rows.shape[1] == 15 else (3, 3), (size[0] // 16, size[1] // 16)
            with_row = np.concatenate([np.zeros_like(rows[:, :1]), rows], axis=1)
            want = with_row if old == new else position.resize_position_embedding(with_row, new, old, 1)
        assert np.allclose(got, want, atol=1e-6), (rows.shape, size)


def test_table_layouts_without_a_recorded_grid():
    layout = position.table_layout
    assert layout(50, True, 51, (5, 10), False) == (True, (7, 7))  # Google /32 at 224 into 160x320: resampled
    assert layout(16, True, 16, (3, 5), False) == (True, (3, 5))  # not square: the model's own size
    assert layout(169, True, 169, (12, 14), True) == (True, (12, 14))  # timm at its own rectangular size
    assert layout(196, True, 197, (14, 14), True) == (False, (14, 14))  # timm no_embed_class at its own size
    assert layout(196, True, 257, (16, 16), True) == (False, (14, 14))  # ... and resampled
    assert layout(197, True, 257, (16, 16), True) == (True, (14, 14))
    assert layout(15, True, 26, (5, 5), False) is None  # nothing fits: a shape mismatch with a hint


def test_pytorch_zip_checkpoint_gets_the_safetensors_advice(tmp_path):
    import zipfile

    for name in ("model.pth", "pytorch_model.zip"):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        with pytest.raises(ValueError, match="save the state dict with safetensors"):
            weights.load_weights(build(image_size=32, **TINY), str(path))


def test_original_layout_under_params_keeps_its_class_row(tmp_path):
    with np.load(fixture("google_augreg.npz")) as data:
        arrays = {"params/" + k: data[k] for k in data.files}
    np.savez(tmp_path / "params.npz", **arrays)
    got = weights.read_checkpoint(str(tmp_path / "params.npz"), num_heads=3)
    want = weights.read_checkpoint(fixture("google_augreg.npz"), num_heads=3)
    assert got[weights.POS].shape == want[weights.POS].shape and np.array_equal(got[weights.POS], want[weights.POS])


def test_class_token_checkpoint_into_gap_model_hints(tmp_path):
    with pytest.raises(ValueError, match="use class_token=True"):
        build(pooling="gap", weights=fixture("google_augreg.npz"), **AUGREG)

def test_grey_model_sums_rgb_patch_kernel():
    rgb = build(weights=fixture("google_augreg.npz"), **AUGREG)
    with pytest.warns(UserWarning, match="1-channel"):
        grey = build(weights=fixture("google_augreg.npz"), channels=1, **AUGREG)
    x = wc.images(64, 3)[..., :1]
    assert np.abs(np.asarray(grey(x)) - np.asarray(rgb(np.repeat(x, 3, axis=-1)))).max() < 1e-4


def test_bfloat16_arrays_load_as_float32(tmp_path):
    with np.load(fixture("big_vision_scan.npz")) as data:
        arrays = {k: data[k] for k in data.files}
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16).view("V2") for k, v in arrays.items()}
    np.savez(tmp_path / "bf16.npz", **bits)
    read = weights.read_checkpoint(str(tmp_path / "bf16.npz"), num_heads=2)
    truncated = (arrays["params/head/kernel"].view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert read["head/kernel"].dtype == np.float32 and np.array_equal(read["head/kernel"], truncated)


@pytest.mark.parametrize("name", ["google_augreg.npz", "timm_vit.safetensors"])
def test_truncated_file_is_a_clear_error(name, tmp_path):
    data = open(fixture(name), "rb").read()
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        weights.load_weights(build(**AUGREG), str(path))


def test_missing_file_unknown_format_and_wrong_model(tmp_path):
    import keras

    with pytest.raises(ValueError, match="must be a vit_keras VisionTransformer"):
        weights.load_weights(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
                             fixture("google_augreg.npz"))
    with pytest.raises(FileNotFoundError, match="not found"):
        weights.load_weights(build(**AUGREG), str(tmp_path / "nope.npz"))
    (tmp_path / "notes.txt").write_text("hello, not a checkpoint")
    with pytest.raises(ValueError, match="neither an .npz"):
        weights.load_weights(build(**AUGREG), str(tmp_path / "notes.txt"))


# ---- URLs ---------------------------------------------------------------------------------------------------

@pytest.fixture
def server(monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):  # a CI proxy must not swallow requests to 127.0.0.1
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    s = WeightServer(FIXTURES)
    yield s
    s.close()


def test_url_download_is_cached_and_checked(server, tmp_path, monkeypatch):
    digest = hashlib.sha256(open(fixture("google_augreg.npz"), "rb").read()).hexdigest()
    monkeypatch.setenv("VIT_KERAS_CACHE", str(tmp_path / "cache"))
    url = f"{server.url}/google_augreg.npz#sha256={digest}"
    model = build(weights=url, **AUGREG)
    check_logits(model, "google_augreg", 64)
    cached = tmp_path / "cache" / f"127.0.0.1_{server.url.rsplit(':', 1)[1]}" / "google_augreg.npz"
    assert cached.is_file() and [p for p in os.listdir(cached.parent) if p.startswith(".")] == []
    weights.load_weights(model, url)  # second time: from the cache, no request
    assert len(server.requests) == 1

    with pytest.raises(ValueError, match="expected 0{64}"):
        weights.load_weights(model, f"{server.url}/timm_vit.safetensors", cache_dir=tmp_path / "c2",
                             sha256="0" * 64)
    assert not any(files for _, _, files in os.walk(tmp_path / "c2")), "a bad download was cached"
    with pytest.raises(ValueError, match="has sha256"):  # the cached file no longer matches what is asked
        weights.load_weights(model, f"{server.url}/google_augreg.npz#sha256={'1' * 64}")


def test_truncated_download_and_offline_errors(server, tmp_path):
    url = f"{server.url}/google_augreg.npz"
    server.cut["/google_augreg.npz"] = 104  # the whole length announced, 104 bytes sent, the connection closed
    with pytest.raises(DownloadError, match="truncated"):  # kept as a .part, which the next try resumes
        weights.load_weights(build(**AUGREG), url, cache_dir=tmp_path)
    assert [f for _, _, files in os.walk(tmp_path) for f in files] == ["google_augreg.npz.part"]
    server.close()  # now nothing listens on that port: as good as offline
    with pytest.raises(DownloadError) as info:
        weights.load_weights(build(**AUGREG), url, cache_dir=tmp_path)
    target = os.path.join(str(tmp_path), f"127.0.0.1_{server.url.rsplit(':', 1)[1]}", "google_augreg.npz")
    assert "offline" in str(info.value) and target in str(info.value)
    with pytest.raises(DownloadError) as info:  # credentials stay out of the message and of the cache path
        weights.load_weights(build(**AUGREG), url.replace("://", "://user:secret@"), cache_dir=tmp_path)
    assert "secret" not in str(info.value) and target in str(info.value)
    os.makedirs(os.path.dirname(target), exist_ok=True)  # put the file where the message says: it now loads offline
    shutil.copy(fixture("google_augreg.npz"), target)
    model = weights.load_weights(build(**AUGREG), url, cache_dir=tmp_path)
    check_logits(model, "google_augreg", 64)


def test_readers_return_what_they_found_beside_the_weights(tmp_path):
    """The grid save_npz records and the timm mark are findings of the reader, not arrays among the weights."""
    model = build(image_size=(24, 40), **TINY)
    saved = weights.read_checkpoint(weights.save_npz(model, tmp_path / "m.npz"), num_heads=2)
    assert saved.grid == (3, 5) and not saved.timm_table
    assert weights.GRID not in saved and sorted(saved) == sorted(weights.model_arrays(model))
    google = weights.read_checkpoint(fixture("google_augreg.npz"), num_heads=3)
    assert google.grid is None and not google.timm_table
    timm = weights.read_checkpoint(fixture("timm_vit.safetensors"), num_heads=2)
    assert timm.timm_table and timm.grid is None and all(hasattr(v, "shape") for v in timm.values())
    hf = weights.read_checkpoint(fixture("hf_vit_classifier.safetensors"), num_heads=4)
    assert not hf.timm_table
