"""The notebooks run top to bottom in fast mode (tiny model, few steps) and are saved without outputs."""

import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_four_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["1_", "2_", "3_", "4_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_saved_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} was saved with outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("VIT_KERAS_FAST", "1")
    monkeypatch.setenv("VIT_KERAS_WORK", str(tmp_path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    assert any(os.scandir(tmp_path)), "the notebook wrote nothing to its work folder"
