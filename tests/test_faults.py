"""The fault matrix: `prepare`, `train` and `export` killed (SIGKILL) at several points and out of disk (ENOSPC) at
every file they write, then run again. After each fault: the error names the file, nothing finished is lost, and
the rerun ends where an uninterrupted run ends (the same shards byte for byte, the same history rows, the same
.tflite bytes). Faults are injected where every whole file is published (``vit_keras.files.publish``, after its
temp file is written and before its rename): in this process, or in a child process (tests/fault_driver.py) for
a kill. A real small tmpfs covers the full disk as a user meets it.
"""

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vit_keras import files as vit_files
from vit_keras.files import DiskFull

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = ["--hidden-size", "16", "--num-heads", "2", "--mlp-dim", "32", "--num-layers", "1"]
PREPARE = ["--image-size", "16", "--images-per-shard", "4"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """3 classes of 14 small PNG photos, and one file that is no image."""
    from PIL import Image

    root = tmp_path_factory.mktemp("faults") / "photos"
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(14):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.png")
    (root / "class1" / "broken.png").write_bytes(b"not a png")
    return root


def prepare(photos, out, log=lambda message: None):
    from vit_keras.data.prepare import prepare as write

    return write(f"folder:{photos}", str(out), 16, images_per_shard=4, log=log)


@pytest.fixture(scope="module")
def reference(photos, tmp_path_factory):
    """An uninterrupted prepare: {file name: bytes}."""
    out = tmp_path_factory.mktemp("reference") / "shards"
    prepare(photos, out)
    return folder_bytes(out)


def folder_bytes(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


class Faults:
    """``vit_files.publish`` failing with ENOSPC at the ``at``-th file; ``published`` lists every file offered."""

    def __init__(self, monkeypatch, at):
        self.at, self.published, self.original = at, [], vit_files.publish
        monkeypatch.setattr(vit_files, "publish", self.publish)

    def publish(self, temp, path):
        self.published.append(path)
        if len(self.published) == self.at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.original(temp, path)


def driver(mode, at, *argv, timeout=300):
    """tests/fault_driver.py in a child process: (its return code, its stderr)."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fault_driver.py"), mode, str(at), *argv],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return run.returncode, run.stderr


# ----------------------------------------------------------------------------- prepare


def test_prepare_out_of_disk_at_every_file_then_rerun_equals_an_uninterrupted_run(photos, reference, tmp_path,
                                                                                   monkeypatch):
    count = len(reference) + 1  # prepare.json first, then the shards and shards.json
    for at in range(1, count + 1):
        out = tmp_path / f"at{at}"
        faults = Faults(monkeypatch, at)
        with pytest.raises(DiskFull, match=rf"the disk is full: writing {out}/\S+ failed .* was left as it was"):
            prepare(photos, out)
        failed = faults.published[-1]
        monkeypatch.setattr(vit_files, "publish", faults.original)
        assert not any(name.startswith(".tmp-") for name in os.listdir(out)), "a temp file was left"
        assert not os.path.exists(failed) and not (out / "shards.json").exists()
        prepare(photos, out)
        assert folder_bytes(out) == reference, f"a rerun after ENOSPC at file {at} ({failed})"


@pytest.mark.parametrize("at", [1, 2, 7, 12, 13])  # prepare.json, the first shard, mid-way, the val shard, manifest
def test_prepare_killed_mid_write_then_rerun_resumes_to_an_uninterrupted_runs_files(photos, reference, tmp_path,
                                                                                    at):
    out = tmp_path / "shards"
    code, stderr = driver("kill", at, "prepare", "--data", f"folder:{photos}", "--out", str(out), *PREPARE)
    assert code == -9, stderr[-2000:]
    kept = {name for name in os.listdir(out) if name.endswith(".tfrecord") and not name.startswith(".tmp-")}
    log = []
    prepare(photos, out, log.append)
    assert folder_bytes(out) == reference
    said = [int(line.split("kept ")[1].split()[0]) for line in log if " kept " in line]
    assert sum(said) == len(kept), "\n".join(log)  # every finished shard kept, none written twice
    assert any("taking over the lock left by process" in line for line in log), log


def test_prepare_refuses_other_settings_and_other_files_naming_them(photos, tmp_path, monkeypatch):
    out = tmp_path / "shards"
    Faults(monkeypatch, 5)
    with pytest.raises(DiskFull):
        prepare(photos, out)  # cut short after 3 shards
    monkeypatch.undo()
    from vit_keras.data.prepare import prepare as write

    with pytest.raises(ValueError, match=r"shards of a prepare cut short with other settings \(image_size: "
                                         r"\[16, 16\] -> \[20, 20\]"):
        write(f"folder:{photos}", str(out), 20, images_per_shard=4)
    other = tmp_path / "other"
    other.mkdir()
    (other / "data-000.tfrecord").write_bytes(b"another tool's")
    with pytest.raises(ValueError, match=r"holds files `vit-keras prepare` did not write \(data-000.tfrecord\).*"
                                         "Nothing was deleted"):
        prepare(photos, other)
    assert (other / "data-000.tfrecord").read_bytes() == b"another tool's"


def test_a_live_writer_refuses_a_second_one_by_process_id(photos, tmp_path):
    """A folder held by a live process is refused with its id; one whose holder is gone is taken over."""
    from vit_keras.locks import FolderLocked, LOCK_NAME, hold

    out = tmp_path / "shards"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from vit_keras.locks import hold\n"
                               f"with hold({str(out)!r}, 'prepare'):\n print('held', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLocked, match=rf"is held by process {holder.pid} \(prepare, since .*still running"):
            prepare(photos, out)
        record = json.loads((out / LOCK_NAME).read_text())
        assert record["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    said = []
    with hold(str(out), "train", log=said.append):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert said and f"taking over the lock left by process {holder.pid}" in said[0]
    assert not (out / LOCK_NAME).exists()
    (out / LOCK_NAME).write_text(json.dumps(dict(pid=1, host="another-machine", command="train", since=0)))
    with pytest.raises(FolderLocked, match="on another machine, 'another-machine'.*delete .*vit-keras.lock"):
        prepare(photos, out)


# ----------------------------------------------------------------------------- train


def train_args(out, epochs=2):
    return ["train", "--data", "fashion_mnist", "--limit", "96", "--epochs", str(epochs), "--batch-size", "32",
            "--image-size", "16", "--out", str(out), "--no-jit", "--quiet", *TINY_ARGS]


def epochs_logged(out):
    rows = (out / "history.csv").read_text().splitlines()
    return [row.split(",")[0] for row in rows[1:]]


def test_train_out_of_disk_at_every_file_then_rerun_completes(tmp_path, monkeypatch, capsys):
    from vit_keras.apps import cli

    counter = Faults(monkeypatch, -1)
    assert cli.main(train_args(tmp_path / "count", epochs=1)) == 0
    written = [os.path.basename(path) for path in counter.published]
    monkeypatch.setattr(vit_files, "publish", counter.original)
    assert written == ["config.json", "labels.txt", "checkpoint.keras", "state-e00001-s000000000.npz",
                       "history.csv", "model.keras", "config.json"]  # an epoch's files, and the run's
    for at in range(1, len(written) + 1):
        out = tmp_path / f"at{at}"
        faults = Faults(monkeypatch, at)
        capsys.readouterr()
        assert cli.main(train_args(out, epochs=1)) == 2
        error = capsys.readouterr().err
        failed = faults.published[-1]
        assert f"the disk is full: writing {failed} failed" in error and "Traceback" not in error
        monkeypatch.setattr(vit_files, "publish", faults.original)
        assert cli.main(train_args(out, epochs=1)) == 0, f"the rerun after ENOSPC at {failed}"
        assert epochs_logged(out) == ["0"]
        assert json.loads((out / "config.json").read_text())["completed"]
        assert not (out / "backup").exists() and not (out / ".vit-keras.lock").exists()


@pytest.mark.parametrize("at", [3, 5])  # mid-write of epoch 1's checkpoint; of epoch 2's checkpoint
def test_train_killed_mid_write_then_rerun_resumes(tmp_path, at, capsys):
    from vit_keras.apps import cli

    out = tmp_path / "run"
    code, stderr = driver("kill", at, *train_args(out))
    assert code == -9, stderr[-2000:]
    assert not (out / "model.keras").exists()
    capsys.readouterr()
    assert cli.main(train_args(out)) == 0
    said = capsys.readouterr().out
    assert "taking over the lock left by process" in said
    assert epochs_logged(out) == ["0", "1"]


# ----------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    import vit_keras

    path = tmp_path_factory.mktemp("export") / "model.keras"
    model = vit_keras.create_model("vit_ti16", image_size=16, channels=1, patch_size=8, hidden_size=16, num_heads=2,
                                   mlp_dim=32, num_layers=1, num_classes=3, class_names=["a", "b", "c"])
    model.save(path)
    return path


def test_export_out_of_disk_or_killed_leaves_no_file_and_the_rerun_writes_the_same_bytes(small_model, tmp_path,
                                                                                         monkeypatch):
    from vit_keras.convert.export import export_tflite

    (tmp_path / "clean").mkdir()
    reference = tmp_path / "clean" / "model.tflite"
    export_tflite(small_model, reference, quantize="float32")
    out = tmp_path / "model.tflite"
    Faults(monkeypatch, 1)
    with pytest.raises(DiskFull, match=rf"writing {out} failed"):
        export_tflite(small_model, out, quantize="float32")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["clean"]  # no file, no temp file, no lock
    code, stderr = driver("kill", 1, "export", str(small_model), "--out", str(out), "--quantize", "float32")
    assert code == -9, stderr[-2000:]
    assert not out.exists()
    export_tflite(small_model, out, quantize="float32")
    assert out.read_bytes() == reference.read_bytes()


def test_prepare_on_a_real_full_disk_names_the_shard_and_resumes_elsewhere(photos, reference, tmp_path):
    """TensorFlow's record writer meets the full disk (ResourceExhaustedError): the error names the shard, and
    the folder, copied to a disk with room, resumes to an uninterrupted run's files."""
    import shutil

    from disks import full_disk

    disk = tmp_path / "disk"
    with full_disk(disk, size="40k") as _:
        with pytest.raises(DiskFull, match=rf"writing {disk}/shards/train-\d+\.tfrecord failed \(\S+ kB free"):
            prepare(photos, disk / "shards")
        shutil.copytree(disk / "shards", tmp_path / "shards")
    log = []
    prepare(photos, tmp_path / "shards", log.append)
    assert folder_bytes(tmp_path / "shards") == reference
    assert any(" kept " in line for line in log)
