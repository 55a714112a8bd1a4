"""verify --per-layer (convert/quant_report.py): each quantized tensor's int8 error against the file's float twin."""

import keras
import numpy as np
import pytest

import vit_keras
from vit_keras.apps.cli import main
from vit_keras.convert import quant_report
from vit_keras.convert.export import export_tflite
from vit_keras.convert.graph import keras_scores
from vit_keras.convert.metadata import pack_model, unpack_model
from vit_keras.convert.runtime import tflite_scores

TINY = dict(image_size=32, patch_size=8, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, num_classes=10,
            include_preprocessing=True)
CLASSES = [f"c{i}" for i in range(10)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny random RGB ViT (.keras, labels.txt) and its files in every mode, with 40 test images."""
    folder = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)  # the same weights every run: their rounding error decides the bounds below
    model = vit_keras.create_model("vit_ti16", **TINY)
    model.save(folder / "tiny.keras")
    (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    images = rng.integers(0, 256, (160, 32, 32, 3), dtype=np.uint8)
    paths = {"keras": folder / "tiny.keras"}
    for mode in ("float32", "float16", "dynamic", "int8"):
        paths[mode] = folder / f"{mode}.tflite"
        export_tflite(model, paths[mode], quantize=mode, labels=CLASSES,
                      calibration=images[:120] if mode == "int8" else None, calibration_size=120)
    return paths, images[120:], keras_scores(model, images[120:])


def test_float_twin_keeps_the_graph_and_computes_it_in_float(files, tmp_path):
    paths, images, reference = files
    data = paths["int8"].read_bytes()
    twin, alias = quant_report.float_twin(data)
    assert not quant_report.quantized_activations(twin)  # nothing left in integers
    assert len(unpack_model(twin).subgraphs[0].tensors) == len(unpack_model(data).subgraphs[0].tensors)
    assert alias  # the dropped QUANTIZE / DEQUANTIZE ops map to their inputs
    (tmp_path / "twin.tflite").write_bytes(twin)
    scores = tflite_scores(tmp_path / "twin.tflite", images.astype(np.float32))
    # Only the weights are rounded: far closer to Keras than the int8 file itself.
    twin_error = np.abs(scores - reference).max()
    assert twin_error < 0.05
    assert twin_error < np.abs(tflite_scores(paths["int8"], images) - reference).max()


def test_rows_are_worst_first_and_name_every_quantized_activation(files):
    paths, images, reference = files
    rows, summary = quant_report.layer_errors(paths["int8"], images[:8], reference[:8])
    assert len(rows) == len(quant_report.quantized_activations(paths["int8"].read_bytes()))
    own = [row["own"] for row in rows]
    assert own == sorted(own, reverse=True) and 0 < own[0] < 1
    assert all(0 <= row["clipped"] <= 1 and row["accumulated"] >= 0 for row in rows)
    assert any(row["tensor"].startswith("input of FULLY_CONNECTED") for row in rows)
    assert summary["images"] == 8 and 0 <= summary["int8_vs_reference"] <= 1
    table = quant_report.format_layer_errors(rows, summary, top=3, file="int8.tflite")
    assert table.count("\n| ") == 4 and f"({len(rows) - 3} more" in table


def test_a_coarse_tensor_comes_first(files, tmp_path):
    """Make one quantized activation's step 40x coarser: the report names it as the worst."""
    paths, images, reference = files
    model = unpack_model(paths["int8"].read_bytes())
    found = quant_report.quantized_activations(paths["int8"].read_bytes())
    index = sorted(found)[len(found) // 2]
    tensor = model.subgraphs[0].tensors[index]
    tensor.quantization.scale = np.asarray(tensor.quantization.scale) * 40
    coarse = tmp_path / "coarse.tflite"
    coarse.write_bytes(pack_model(model))
    rows, _ = quant_report.layer_errors(coarse, images[:8], reference[:8])
    assert found[index][0] in rows[0]["tensor"] or rows[0]["tensor"].startswith("input of")
    assert rows[0]["own"] > 3 * rows[1]["own"]


@pytest.mark.parametrize("mode", ["float32", "float16"])
def test_a_float_file_says_it_has_nothing_quantized(files, mode):
    paths, images, _ = files
    with pytest.raises(quant_report.NotQuantizedError, match="no int8 .* activations and no int8 weights"):
        quant_report.layer_errors(paths[mode], images[:2])


def test_a_dynamic_range_file_reports_its_run_time_rounding(files):
    paths, images, reference = files
    rows, summary = quant_report.layer_errors(paths["dynamic"], images[:4], reference[:4])
    assert rows and all(row["tensor"].endswith("(per row at run time)") and row["scale"] is None for row in rows)
    assert all(0 < row["own"] < 0.05 for row in rows)  # 8 bits over each row's own range


def test_verify_per_layer_on_the_command_line(files, tmp_path, capsys):
    import os

    from PIL import Image

    paths, images, _ = files
    for i, image in enumerate(images[:4]):  # a folder whose class names are the model's
        os.makedirs(tmp_path / "data" / CLASSES[i % 2], exist_ok=True)
        Image.fromarray(image).save(tmp_path / "data" / CLASSES[i % 2] / f"{i}.png")
    assert main(["verify", str(paths["int8"]), str(paths["float32"]), "--against", str(paths["keras"]),
                 "--data", f"folder:{tmp_path / 'data'}", "--per-layer", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "int8.tflite: " in out and "| tensor | own error |" in out and "more, with less own error" in out
    assert "float32.tflite has no int8" in out
