"""evaluate and verify on folders: the training folder's seeded held-out part, any other folder whole, a folder of
split folders as given; the printout says which images were used."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from vit_keras.apps.cli import main


def make_folder(root, classes=("a", "b"), per_class=10):
    rng = np.random.default_rng(len(str(root)))
    for name in classes:
        os.makedirs(root / name, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A model 'trained' on folder `train`: a tiny ViT and the config.json a run records."""
    from vit_keras.training import train

    root = tmp_path_factory.mktemp("eval")
    make_folder(root / "train")
    model = train.build_model_to_train(2, 1, (12, 12), image_size=12, model_overrides=dict(num_layers=1, hidden_size=16,
                                                                             num_heads=1, mlp_dim=16))
    run = root / "run"
    run.mkdir()
    model.save(run / "model.keras")
    (run / "labels.txt").write_text("a\nb\n")
    config = {"data": f"folder:{root / 'train'}", "seed": 3, "val_fraction": 0.2}
    (run / "config.json").write_text(json.dumps(config))
    return root, run / "model.keras"


def evaluate(model, data, capsys):
    assert main(["evaluate", str(model), "--data", data]) == 0
    return capsys.readouterr().out.splitlines()[0]


def test_the_training_folder_gives_its_held_out_part(run_dir, capsys):
    root, model = run_dir
    line = evaluate(model, f"folder:{root / 'train'}", capsys)
    assert ": 4 images, the seeded 20% held-out part of the folder (seed 3)" in line


def test_another_folder_is_evaluated_whole(run_dir, capsys):
    root, model = run_dir
    make_folder(root / "other", per_class=7)
    assert ": 14 images, the whole folder" in evaluate(model, f"folder:{root / 'other'}", capsys)


def test_a_folder_of_split_folders_gives_its_test_folder(run_dir, capsys):
    root, model = run_dir
    make_folder(root / "splits" / "train", per_class=5)
    make_folder(root / "splits" / "test", per_class=3)
    assert ": 6 images, its test/ folder" in evaluate(model, f"folder:{root / 'splits'}", capsys)


def test_verify_reads_another_folder_whole(run_dir, tmp_path):
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.verify import verify_files

    root, model = run_dir
    make_folder(root / "other2", per_class=6)
    path = tmp_path / "m.tflite"
    export_tflite(str(model), str(path), quantize="float32")
    report = verify_files([str(path)], str(model), f"folder:{root / 'other2'}", runs=2, threads=(1,))
    assert report.startswith(f"12 test images of folder:{root / 'other2'} (the whole folder)")


def test_verify_reads_a_folder_too_large_for_memory_a_chunk_at_a_time(run_dir, tmp_path, monkeypatch):
    from vit_keras.convert import verify
    from vit_keras.convert.export import export_tflite
    from vit_keras.data import sources

    root, model = run_dir
    make_folder(root / "other3", per_class=9)
    path = tmp_path / "m.tflite"
    export_tflite(str(model), str(path), quantize="float32")
    whole = verify.verify_files([str(path)], str(model), f"folder:{root / 'other3'}", runs=2, threads=(1,))
    monkeypatch.setattr(sources, "memory_budget", lambda: 1_000)  # 18 images of 12x12 are beyond it
    monkeypatch.setattr(verify, "CHUNK_IMAGES", 5)
    names, _, count, chunks = verify.split_chunks(f"folder:{root / 'other3'}", "test", 12, whole_folder=True)
    assert (names, count, [len(labels) for _, labels in chunks]) == (["a", "b"], 18, [5, 5, 5, 3])
    streamed = verify.verify_files([str(path)], str(model), f"folder:{root / 'other3'}", runs=2, threads=(1,))
    rows = [line.split("|")[6:9] for report in (whole, streamed) for line in report.splitlines()
            if line.startswith("| m.tflite")]  # agreement, accuracy, max abs diff
    assert streamed.startswith("18 test images") and rows[0] == rows[1]


def test_label_mapping_by_name_by_index_or_none():
    from vit_keras.training.evaluation import label_mapping

    labels = ["tench", "goldfish", "shark"]
    by_name = label_mapping(["shark", "tench"], labels, 3)
    assert list(by_name.labels([0, 1, 1])) == [2, 0, 0] and "by name" in by_name.how
    by_index = label_mapping(["0001", "0002"], labels, 3)
    assert list(by_index.labels([0, 1])) == [1, 2] and "class indices" in by_index.how
    digits = label_mapping(["1", "0"], ["0", "1"], 2)  # labels that are digits match by name first
    assert list(digits.labels([0, 1])) == [1, 0]
    for names in (["cat", "dog"], ["0001", "0003"]):  # unknown names; an index past the model's classes
        mapping = label_mapping(names, labels, 3)
        assert not mapping and "are not the model's" in mapping.how
    assert label_mapping(["x", "y", "z"], None, 3)  # no labels to match: the data's order, as many classes


def test_verify_and_evaluate_state_accuracy_only_for_the_model_classes(run_dir, tmp_path, capsys):
    """Folders named by class index are the model's classes; folders of other names get agreement only."""
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.verify import verify_files

    root, model = run_dir
    path = tmp_path / "m.tflite"
    export_tflite(str(model), str(path), quantize="float32")
    make_folder(root / "indexed", classes=("0000", "0001"), per_class=3)
    make_folder(root / "strangers", classes=("cat", "dog"), per_class=3)
    indexed = verify_files([str(path)], str(model), f"folder:{root / 'indexed'}", runs=2, threads=(1,))
    assert "read as class indices" in indexed and "not stated" not in indexed
    strangers = verify_files([str(path)], str(model), f"folder:{root / 'strangers'}", runs=2, threads=(1,))
    assert "are not the model's" in strangers and "agreement only" in strangers
    assert "| not stated |" in strangers and "100.00%" in strangers  # float32 agrees with Keras
    assert main(["evaluate", str(model), "--data", f"folder:{root / 'strangers'}"]) == 0
    out = capsys.readouterr().out
    assert "accuracy: not stated" in out and "loss" not in out
    assert main(["evaluate", str(model), "--data", f"folder:{root / 'indexed'}"]) == 0
    assert "read as class indices" in capsys.readouterr().out
