"""The CLI prints its own lines, not the runtimes' logs (TensorFlow, LiteRT, absl, the converter); --verbose
brings those back, and errors show either way. Run as real processes: the runtimes write to descriptor 2."""

import re
import subprocess
import sys

import pytest
from PIL import Image

# A line from a runtime's logging rather than from vit-keras itself.
RUNTIME_LOG = re.compile(r"^[IWEF]\d{4} |^(INFO|WARNING|ERROR|VERBOSE):|absl|oneDNN|trackable_obj|XNNPACK"
                         r"|NPU accelerator|npu_registry|compiler_plugin|CompilerPlugin"  # not verify's NPU column
                         r"|fully_quantize|UserWarning|warnings\.warn|LiteRT|TensorFlow Lite")


def runtime_lines(text):
    return [line for line in text.splitlines() if RUNTIME_LOG.search(line)]


def cli(*args, cwd):
    """`vit-keras ARGS` as its own process (the console script's entry point); stdout and stderr together."""
    result = subprocess.run([sys.executable, "-m", "vit_keras.apps.cli", *map(str, args)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return result.returncode, result.stdout


@pytest.fixture(scope="module")
def images(tmp_path_factory, fashion_test):
    folder = tmp_path_factory.mktemp("images")
    for i, image in enumerate(fashion_test[0][:3]):
        Image.fromarray(image[:, :, 0], "L").save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    """`vit-keras export` of the tiny model to int8 (TensorFlow, the converter and the calibrator all log)."""
    out = tmp_path_factory.mktemp("export") / "model_int8.tflite"
    code, output = cli("export", models["keras"], "--quantize", "int8", "--calibration", "fashion_mnist",
                       "--calibration-size", "100", "--out", out, cwd=out.parent)
    return code, output, out


def test_export_prints_only_its_own_line(exported):
    code, output, out = exported
    assert code == 0, output
    lines = output.splitlines()  # the calibration sample's report (a --limit), then the file's line
    assert len(lines) == 2 and lines[0].startswith("limit 100 (seed 0, class-balanced): kept 100"), output
    assert lines[1].startswith(f"wrote {out} (") and "int8" in lines[1], output
    assert runtime_lines(output) == []


def test_verify_prints_only_its_report(exported, models, tmp_path):
    code, output = cli("verify", exported[2], "--against", models["keras"], "--data", "fashion_mnist",
                       "--limit", "20", "--runs", "2", "--threads", "1", cwd=tmp_path)
    assert code == 0, output
    assert "| file |" in output and f"| {exported[2].name} |" in output  # its table, both runtimes timed
    assert runtime_lines(output) == []


@pytest.mark.parametrize("runtime", ["interpreter", "compiled"])
def test_classify_prints_only_its_results(exported, images, tmp_path, runtime):
    code, output = cli("classify", exported[2], images, "--top-k", "2", "--runtime", runtime, cwd=tmp_path)
    assert code == 0, output
    assert [line.split()[0] for line in output.splitlines()[::2]] == [str(images / f"{i}.png") for i in range(3)]
    assert len(output.splitlines()) == 6  # a path line and a labels line per image, nothing else
    assert runtime_lines(output) == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_brings_the_runtime_logs_back(exported, images, tmp_path, where):
    args = ["classify", exported[2], images, "--runtime", "compiled"]
    args = ["--verbose", *args] if where == "before" else [*args, "--verbose"]
    code, output = cli(*args, cwd=tmp_path)
    assert code == 0, output
    assert any("LiteRT" in line or "XNNPACK" in line for line in runtime_lines(output)), output
    assert str(images / "0.png") in output  # and its own lines still


def test_an_error_after_the_runtimes_loaded_still_shows(exported, models, tmp_path):
    broken = tmp_path / "broken.tflite"
    broken.write_bytes(b"TFL3" * 64)  # loads LiteRT and TensorFlow before it fails
    code, output = cli("verify", broken, "--against", models["keras"], "--data", "fashion_mnist", "--limit", "5",
                       cwd=tmp_path)
    assert code == 2
    assert output.startswith("vit-keras verify: error: ") and len(output.splitlines()) == 1, output


def test_a_runtime_error_is_replayed_without_its_info_lines(tmp_path):
    """Native writes to descriptor 2 are held back; when the command fails, the warnings and errors among them
    come out (with their continuation lines), the INFO-level ones do not; the command's own stderr is live."""
    code = """
import os, sys
from vit_keras.apps.quiet import runtime_logs_hidden
with runtime_logs_hidden():
    os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n"
                b"I0000 00:00:1.5 7 port.cc:153] a notice\\nits second line\\n"
                b"E0000 00:00:1.5 7 kernel.cc:9] the cause\\n  its detail\\nINFO: [registry.cc:3] more notice\\n")
    print("own line", file=sys.stderr)
    raise RuntimeError("the failure")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[:3] == ["own line", "E0000 00:00:1.5 7 kernel.cc:9] the cause", "  its detail"]
    assert lines[-1] == "RuntimeError: the failure"
    assert not any("notice" in line or "absl" in line for line in lines)
