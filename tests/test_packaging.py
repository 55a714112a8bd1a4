"""The wheel as a user gets it: built offline, installed (not editable) into a fresh environment, run outside
the checkout. The fresh environment sees the project's dependencies but not the project's editable install."""

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from vit_keras.apps.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from: the pyproject's package folders and the files it names.
SOURCES = ("pyproject.toml", "README.md", "vit_keras", "convert", "apps")

pytestmark = pytest.mark.slow


def run(*command, cwd, timeout=300):
    result = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built from a copy of the sources, so no build/ folder left in the checkout can add stale files."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
        "-w", out, source, cwd=out)
    (path,) = out.glob("vit_keras3-*.whl")
    return path


@pytest.fixture(scope="module")
def environment(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed; a .pth line adds the project venv's site-packages for the
    dependencies. The editable install's own .pth there is not processed (only a site directory's are)."""
    root = tmp_path_factory.mktemp("env")
    run(sys.executable, "-m", "venv", "--without-pip", root, cwd=root)
    python = root / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, cwd=root)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root).strip())
    (site / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return root, site


@pytest.fixture
def outside(tmp_path):
    """A working directory outside the checkout, so nothing is imported from it by accident."""
    assert REPO not in tmp_path.parents
    return tmp_path


def test_wheel_holds_one_package_with_the_timm_script(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = wheel.name.split("-py3")[0] + ".dist-info"  # vit_keras3-0.1.0.dist-info
    top = {name.split("/")[0] for name in names}
    assert top == {"vit_keras", dist_info}, top
    for path in ("vit_keras/inference/timm_reference.py", "vit_keras/convert/export.py", "vit_keras/apps/cli.py",
                 "vit_keras/apps/quiet.py", "vit_keras/apps/commands/bench.py"):
        assert path in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "vit-keras = vit_keras.apps.cli:main" in entry_points


def test_the_installed_copy_is_what_imports(environment, outside):
    root, site = environment
    code = ("import json, vit_keras, vit_keras.apps.cli, vit_keras.convert.metadata, numpy; print(json.dumps("
            "[vit_keras.__file__, vit_keras.apps.cli.__file__, vit_keras.convert.metadata.__file__, numpy.__file__]))")
    ours, cli, convert, numpy = map(Path, json.loads(run(root / "bin" / "python", "-c", code, cwd=outside)))
    for path in (ours, cli, convert):
        assert site in path.parents and REPO not in path.parents, path
    assert Path(sysconfig.get_path("purelib")) in numpy.parents  # a dependency, from the project's venv


def test_installed_cli_help_and_bench_help(environment, outside):
    vit_keras = environment[0] / "bin" / "vit-keras"
    usage = run(vit_keras, "--help", cwd=outside)
    assert all(name in usage for name in COMMANDS) and "--verbose" in usage
    assert "--timm-python" in run(vit_keras, "bench", "--help", cwd=outside)


def test_installed_cli_exports_and_classifies(environment, outside, fashion_test):
    """A tiny model made with the installed library, exported and classified by the installed CLI."""
    from PIL import Image

    python, vit_keras = environment[0] / "bin" / "python", environment[0] / "bin" / "vit-keras"
    make = ("import keras, vit_keras; keras.utils.set_random_seed(0); vit_keras.create_model('vit_ti16', "
            "image_size=28, channels=1, patch_size=7, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, "
            "num_classes=3, include_preprocessing=True).save('model.keras')")
    run(python, "-c", make, cwd=outside)
    (outside / "labels.txt").write_text("first\nsecond\nthird\n")
    Image.fromarray(fashion_test[0][0, :, :, 0], "L").save(outside / "image.png")
    exported = run(vit_keras, "export", "model.keras", "--quantize", "float32", "--out", "model.tflite", cwd=outside)
    assert exported.startswith("wrote ") and "3 labels" in exported
    result = json.loads(run(vit_keras, "classify", "model.tflite", "image.png", "--json", "--top-k", "3", cwd=outside))
    (only,) = result["results"]
    assert only["path"] == "image.png"
    assert sorted(entry["label"] for entry in only["top"]) == ["first", "second", "third"]
    assert abs(sum(entry["score"] for entry in only["top"]) - 1) < 1e-4
