"""`vit-keras train --export MODES [--web]`: photos to the phone's files in one command, resumable (apps/ship.py)."""

import contextlib
import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from vit_keras.apps.cli import main
from vit_keras.apps.web_export import check_web_runtime

try:
    check_web_runtime()
    RUNTIME_MISSING = None
except (OSError, ValueError) as error:
    RUNTIME_MISSING = str(error)

# The smallest run int8 can calibrate: 2 x 60 noise images, 108 of them in the training part (int8 needs 100).
TINY_RUN = ["--epochs", "1", "--batch-size", "16", "--augment", "none", "--hidden-size", "16", "--num-heads", "1",
            "--mlp-dim", "16", "--num-layers", "1", "--no-jit", "--quiet"]
OUTPUTS = ("model_int8.tflite", "model_float32.tflite", "verify.md")


def make_photos(root, per_class=60):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        os.makedirs(root / name)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(root / name / f"{i}.png")
    return f"folder:{root}"


def run_command(argv):
    """(exit code, stdout, stderr) of `vit-keras` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def mtimes(run, names):
    return {name: os.stat(run / name).st_mtime_ns for name in names}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """One `train --export int8,float32 [--web]` run: (command, run folder, its stdout)."""
    root = tmp_path_factory.mktemp("ship")
    run = root / "run"
    command = ["train", "--data", make_photos(root / "photos"), "--out", str(run), *TINY_RUN,
               "--export", "int8,float32", *([] if RUNTIME_MISSING else ["--web"])]
    code, out, err = run_command(command)
    assert code == 0, err[-3000:]
    return command, run, out


def test_training_writes_each_tflite_with_labels_and_the_verify_report(shipped):
    from vit_keras.convert.metadata import read_labels

    _, run, out = shipped
    for mode in ("int8", "float32"):
        assert read_labels(str(run / f"model_{mode}.tflite")) == ["cat", "dog"]
        assert f"model_{mode}.tflite: exported" in out
    report = (run / "verify.md").read_text()
    assert "top-1 agreement" in report and "test images of folder:" in report
    assert "the seeded 10% held-out part" in report  # the run's own held-out images, not its training part
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| model_")}
    assert set(rows) == {"model_int8.tflite", "model_float32.tflite"}
    assert "100.00%" in rows["model_float32.tflite"]  # float32 agrees with Keras on every image
    assert "verify.md: written" in out and report.splitlines()[0] in out  # the report is printed too


def test_a_rerun_keeps_every_file_and_says_so(shipped):
    command, run, _ = shipped
    names = OUTPUTS + (() if RUNTIME_MISSING else ("web/model.tflite", "web/index.html"))
    before = mtimes(run, names)
    code, out, err = run_command(command)
    assert code == 0, err[-3000:]
    assert mtimes(run, names) == before
    assert "already holds this finished run" in out
    for name in ("model_int8.tflite", "model_float32.tflite", "verify.md") + (() if RUNTIME_MISSING else ("web/",)):
        assert f"{name}: kept (up to date)" in out
    assert "top-1 agreement" in out


def test_a_newer_model_is_exported_and_verified_again(shipped, tmp_path):
    from vit_keras.apps.ship import ship_run

    _, run, _ = shipped
    copy = tmp_path / "run"
    shutil.copytree(run, copy)  # copy2 keeps the mtimes
    earlier = os.stat(copy / "model.keras").st_mtime - 10
    os.utime(copy / "model_float32.tflite", (earlier, earlier))  # as if the model was retrained after the export
    lines = []
    summary = ship_run(copy, "float32", runs=2, threads=(1,), log=lines.append)
    assert summary["steps"]["float32"].startswith("exported") and summary["steps"]["verify.md"] == "written"
    assert os.stat(copy / "model_float32.tflite").st_mtime_ns >= os.stat(copy / "model.keras").st_mtime_ns
    assert "model_int8.tflite" not in (copy / "verify.md").read_text()  # only the files asked for this time
    assert lines[0].startswith("model_float32.tflite: exported") and lines[1] == "verify.md: written"


def test_the_npu_mode_ships_the_full_integer_file(shipped, tmp_path):
    """`--export npu` (ship_run's "npu"): int8 for the npu target, calibrated on the run's own training images."""
    from vit_keras.apps.ship import ship_run
    from vit_keras.convert import flatbuffer

    _, run, _ = shipped
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    summary = ship_run(copy, "npu", runs=2, threads=(1,), log=lambda line: None)
    assert summary["files"] == {"npu": str(copy / "model_npu.tflite")}
    assert summary["steps"]["npu"].startswith("exported")
    assert flatbuffer.float_compute_ops((copy / "model_npu.tflite").read_bytes()) == []
    assert "model_npu.tflite" in (copy / "verify.md").read_text()


@pytest.mark.skipif(RUNTIME_MISSING is not None, reason=f"export_site needs the npm runtime: {RUNTIME_MISSING}")
def test_the_web_site_runs_the_int8_file(shipped):
    _, run, out = shipped
    assert (run / "web" / "model.tflite").read_bytes() == (run / "model_int8.tflite").read_bytes()
    assert (run / "web" / "index.html").is_file() and "web/: exported (from model_int8.tflite)" in out
    assert not [name for name in os.listdir(run) if name.startswith(".tmp-web-")]  # no half-built site left


@pytest.mark.parametrize("flags, message", [
    (["--export", "int9"],
     "--export 'int9': unknown mode 'int9'; valid values are float32, float16, dynamic, int8, npu"),
    (["--export", "npu", "--web"], "--web needs a mode a browser runs besides 'npu'"),
    (["--export", "float32,npu", "--limit", "50"], "--export npu calibrates on at least 100 training images"),
    (["--export", "float16,"], "--export 'float16,': unknown mode ''"),
    (["--web"], "--web needs --export MODE"),
    (["--export", "int8", "--limit", "50"], "--export int8 calibrates on at least 100 training images"),
])
def test_bad_export_flags_fail_before_anything_is_written(tmp_path, flags, message):
    out = tmp_path / "run"
    code, _, err = run_command(["train", "--data", make_photos(tmp_path / "photos", per_class=2), "--out", str(out),
                                *flags])
    assert code == 2 and message in err
    assert not out.exists()


def test_web_without_the_npm_runtime_fails_before_training(tmp_path, monkeypatch):
    from vit_keras.apps import web_export

    monkeypatch.setattr(web_export, "default_runtime_dir", lambda: tmp_path / "no_node_modules")
    out = tmp_path / "run"
    code, _, err = run_command(["train", "--data", make_photos(tmp_path / "photos", per_class=2), "--out", str(out),
                                "--export", "int8", "--web"])
    assert code == 2 and "the in-browser runtime is not installed" in err
    assert not out.exists()
