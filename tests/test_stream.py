"""Data larger than memory: the Augmentation settings, folder and shard streams, the choice of input, prepare, and
each worker of a cluster reading only its own files."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_keras.apps import cli
from vit_keras.data import datasets, prepare, records, shards, sources, stream
from vit_keras.data.augmentation import NO_AUGMENTATION, Augmentation, Batching
from vit_keras.data.stream_batches import StreamBatches
from vit_keras.data.sampling import balanced_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = ["--hidden-size", "32", "--num-heads", "2", "--mlp-dim", "64", "--num-layers", "1", "--distill", "none",
             "--no-jit", "--micro-batches", "1", "--quiet"]


def numbered_folder(root, count=64, classes=2, size=(10, 12), split_folders=False):
    """Gray PNGs whose pixels are all 3 * their number, in ``classes`` class folders (number % classes); with
    ``split_folders``, in train/ with a val/ and a test/ of four images each."""
    train = root / "train" if split_folders else root
    for i in range(count):
        folder = train / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full(size, 3 * i, np.uint8)).save(folder / f"{i:03d}.png")
    for split in ("val", "test") if split_folders else ():
        for i in range(4):
            (root / split / f"class{i % classes}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full(size, 200 + i, np.uint8)).save(root / split / f"class{i % classes}" / f"{i}.png")
    return root


def numbers(x):
    """The number of each image of a batch (its constant pixel / 3)."""
    return np.round(np.asarray(x)[:, 0, 0, 0] / 3).astype(int).tolist()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return numbered_folder(tmp_path_factory.mktemp("numbered"), split_folders=True)


@pytest.fixture(scope="module")
def shard_set(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "set"
    prepare.prepare(f"folder:{folder}", str(out), (10, 12), images_per_shard=8, log=lambda line: None)
    return out


# ---- Augmentation and Batching ----

@pytest.mark.parametrize("options, message", [
    (dict(augment="rotate"), "Unknown `augment`='rotate'; valid values are 'none', 'flip', 'crop', 'randaugment'."),
    (dict(crop_scale=(0.9, 0.5)), "`crop_scale` must be (min, max) area fractions with 0 < min <= max <= 1"),
    (dict(mixup=-1), "`mixup` must be >= 0; got -1."),
    (dict(cutmix=True), "`cutmix` must be >= 0; got True."),
    (dict(erase=2.0), "`erase` must be in [0, 1]; got 2.0."),
    (dict(flip="yes"), "Unknown `flip`='yes'; valid values are True, False."),
])
def test_an_augmentation_is_checked_once_when_it_is_made(options, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        Augmentation(**options)


def test_an_augmentation_applies_to_training_batches_only():
    crops = Augmentation("crop", crop_scale=[0.5, 1], mixup=0.2, erase=0.3)
    assert crops.crop_scale == (0.5, 1.0) and crops.crops and crops.flips and crops.mixes
    assert crops.in_training(True) is crops and crops.in_training(False) == NO_AUGMENTATION
    assert not Augmentation("flip", flip=False).flips and not NO_AUGMENTATION.mixes
    with pytest.raises(ValueError, match="need `one_hot=True`"):
        Batching(10, one_hot=False).check_targets(crops)
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int; got 0"):
        Batching(10, batch_size=0)
    assert Batching(10, training=True).drop_remainder and not Batching(10).drop_remainder
    assert Batching(10).resolve((28, 28, 1)).image_size == (28, 28)


# ---- choosing memory or streaming ----

def test_the_input_is_chosen_by_its_decoded_size(folder, capsys):
    listed = [sources.list_split(f"folder:{folder}", split) for split in ("train", "val")]
    assert listed[0].image_shape == (10, 12, 1) and len(listed[0]) == 64 and len(listed[1]) == 4
    mode, why = sources.choose_input("auto", listed, budget=10**9)
    assert mode == "memory" and "68 images decode to 8.2 KB at 10x12x1, within the memory budget" in why
    mode, why = sources.choose_input("auto", listed, budget=1000)
    assert mode == "stream" and "more than the memory budget" in why and "--in-memory" in why
    assert sources.choose_input("stream", listed) == ("stream", "68 images decode to 8.2 KB at 10x12x1; --stream "
                                                              "(input_mode='stream') asked for it")
    with pytest.raises(ValueError, match="Unknown `input_mode`='disk'; valid values are 'auto', 'memory', 'stream'"):
        sources.choose_input("disk", listed)
    with pytest.raises(ValueError, match="`input_mode`='stream' streams 'folder:PATH' and 'shards:PATH' data"):
        sources.load_splits("fashion_mnist", ["test"], "stream")
    (memory,), mode, _ = sources.load_splits(f"folder:{folder}", ["train"], "memory")
    assert mode == "memory" and isinstance(memory, datasets.ArrayDataset) and len(memory) == 64
    assert sources.memory_budget() < sources.memory_bytes()


# ---- folder streams ----

def test_a_folder_stream_gives_the_in_memory_pixels_and_every_image_once_a_pass(folder, tmp_path):
    source = sources.list_split(f"folder:{folder}", "train")
    memory = source.decode_all()
    evaluation = Batching(2, (10, 12), 1, 16, training=False)
    x = np.concatenate([b[0].numpy() for b in stream.stream_dataset(source, evaluation, NO_AUGMENTATION)])
    np.testing.assert_array_equal(x, memory.images.astype("float32"))  # in order, the same pixels
    numpy_batches = StreamBatches(source, evaluation, NO_AUGMENTATION)
    np.testing.assert_array_equal(np.concatenate([numpy_batches[i][0] for i in range(len(numpy_batches))]), x)
    training = Batching(2, (10, 12), 1, 16, training=True, seed=3)
    batches = iter(stream.stream_dataset(source, training, NO_AUGMENTATION))
    passes = [[n for _ in range(4) for n in numbers(next(batches)[0])] for _ in range(2)]
    assert sorted(passes[0]) == sorted(passes[1]) == list(range(64)) and passes[0] != passes[1]  # reshuffled
    again = iter(stream.stream_dataset(source, training, NO_AUGMENTATION, epoch=1))  # a run resumed at epoch 2
    assert [n for _ in range(4) for n in numbers(next(again)[0])] == passes[1]
    numpy_training = StreamBatches(source, training, NO_AUGMENTATION, steps=4)
    assert sorted(n for i in range(4) for n in numbers(numpy_training[i][0])) == list(range(64))
    # Two JAX processes: each its own part (every other file), 8 of each 16-image step, the same steps.
    steps = sources.steps_per_pass(source, 16, workers=2)
    local = Batching(2, (10, 12), 1, 8, training=True, seed=3)
    parts = [StreamBatches(source.part(index, 2), local, NO_AUGMENTATION, steps) for index in range(2)]
    seen = [[n for i in range(steps) for n in numbers(part[i][0])] for part in parts]
    assert steps == 4 and not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(64))


def test_a_corrupt_file_mid_stream_is_skipped_and_counted_and_the_epoch_goes_on(tmp_path):
    root = numbered_folder(tmp_path / "set", count=24)
    (root / "class1" / "broken.png").write_bytes(b"not an image")
    (root / "class0" / "cut.png").write_bytes((root / "class0" / "000.png").read_bytes()[:40])
    source = sources.list_folder_split(str(root), "train", val_fraction=0.1, image_size=(10, 12), whole=True)
    training = Batching(2, (10, 12), 1, 8, training=True)
    batches = iter(stream.stream_dataset(source, training, NO_AUGMENTATION))
    seen = [n for _ in range(6) for n in numbers(next(batches)[0])]  # two passes of the 24 readable images
    assert sorted(seen) == sorted(list(range(24)) * 2)
    assert len(source.skipped) == 2 and {os.path.basename(path) for path, _ in source.skipped} == {"broken.png",
                                                                                                    "cut.png"}
    numpy_batches = StreamBatches(source, Batching(2, (10, 12), 1, 26), NO_AUGMENTATION)
    assert len(numpy_batches[0][0]) == 26  # the unreadable two replaced by readable images of the batch


# ---- shards ----

@pytest.mark.parametrize("kind", ["folder", "shards"])
def test_a_stream_resumed_mid_epoch_gives_the_rest_of_that_pass_then_the_next(folder, shard_set, kind):
    """A run killed after 2 of an epoch's 4 steps resumes with the batches an uninterrupted run would have seen,
    the same pixels on both pipelines, then goes on with the next epoch's pass."""
    source = (sources.list_split(f"folder:{folder}", "train") if kind == "folder" else
              shards.open_shards(str(shard_set), "train"))
    training = Batching(2, (10, 12), 1, 16, training=True, seed=3)
    whole = iter(stream.stream_dataset(source, training, NO_AUGMENTATION, steps=4))
    uninterrupted = [numbers(next(whole)[0]) for _ in range(8)]  # two epochs of four steps
    resumed = iter(stream.stream_dataset(source, training, NO_AUGMENTATION, steps=4, skip=2))
    assert [numbers(next(resumed)[0]) for _ in range(6)] == uninterrupted[2:]
    numpy_resumed = StreamBatches(source, training, NO_AUGMENTATION, steps=4, skip=2)
    assert len(numpy_resumed) == 2
    first = [numbers(numpy_resumed[i][0]) for i in range(2)]
    numpy_whole = StreamBatches(source, training, NO_AUGMENTATION, steps=4)
    assert first == [numbers(numpy_whole[i][0]) for i in (2, 3)]
    numpy_resumed.on_epoch_end()  # the next epoch is whole again
    assert len(numpy_resumed) == 4


def test_shards_hold_the_folders_pixels_and_stream_on_every_backend(folder, shard_set):
    manifest = json.loads((shard_set / "shards.json").read_text())
    assert manifest["image_size"] == [10, 12] and manifest["channels"] == 1 and manifest["class_names"] == [
        "class0", "class1"]
    assert {name: sum(entry["counts"]) for name, entry in manifest["splits"].items()} == dict(train=64, val=4, test=4)
    in_memory = datasets.load_dataset(f"shards:{shard_set}", "train")
    from_folder = datasets.load_dataset(f"folder:{folder}", "train", image_size=(10, 12))
    order = balanced_order(from_folder.labels, 0)  # shards hold a split in its seeded, class-balanced order
    np.testing.assert_array_equal(in_memory.images, from_folder.images[order])  # PNG: the decoded pixels exactly
    np.testing.assert_array_equal(in_memory.labels, from_folder.labels[order])
    assert sorted(in_memory.labels[:8]) == [0] * 4 + [1] * 4  # any first N: balanced
    source = shards.open_shards(str(shard_set), "train")
    assert len(source) == 64 and len(source.files) == 8
    evaluation = Batching(2, (10, 12), 1, 16)
    tf_images = np.concatenate([b[0].numpy() for b in stream.stream_dataset(source, evaluation, NO_AUGMENTATION)])
    numpy_batches = StreamBatches(source, evaluation, NO_AUGMENTATION)
    np_images = np.concatenate([numpy_batches[i][0] for i in range(len(numpy_batches))])
    np.testing.assert_array_equal(tf_images, in_memory.images.astype("float32"))
    np.testing.assert_array_equal(np_images, tf_images)
    training = Batching(2, (10, 12), 1, 16, training=True)
    batches = iter(stream.stream_dataset(source, training, NO_AUGMENTATION))
    assert sorted(n for _ in range(4) for n in numbers(next(batches)[0])) == list(range(64))
    assert len(datasets.load_dataset(f"shards:{shard_set}", "train", limit=10).labels) == 10  # a calibration set


def test_bad_shards_are_clear_errors_before_training(folder, shard_set, tmp_path):
    with pytest.raises(ValueError, match=r"they hold 10x12 images, but the model takes 32x32"):
        shards.open_shards(str(shard_set), "train", image_size=32)
    with pytest.raises(FileNotFoundError, match="there is no shards.json"):
        shards.open_shards(str(tmp_path), "train")
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in shard_set.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    manifest = json.loads((copy / "shards.json").read_text())
    (copy / "shards.json").write_text(json.dumps(dict(manifest, version=99)))
    with pytest.raises(ValueError, match="version 99; this vit-keras reads 'vit-keras shards' version 1"):
        shards.open_shards(str(copy), "train")
    (copy / "shards.json").write_text(json.dumps(manifest))
    (copy / "train-00003.tfrecord").write_bytes(b"")
    with pytest.raises(ValueError, match="train-00003.tfrecord has no readable header"):
        shards.open_shards(str(copy), "train")
    manifest["splits"]["train"]["counts"][2] = 0
    (copy / "shards.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="train-00002.tfrecord is empty"):
        shards.open_shards(str(copy), "train")
    with pytest.raises(ValueError, match=r"holds finished shards with other settings \(image_size: \[10, 12\] -> "
                                         r"\[10, 10\]"):
        prepare.prepare(f"folder:{folder}", str(shard_set), 10)
    mixed = numbered_folder(tmp_path / "mixed", count=8, split_folders=True)
    (mixed / "test" / "class1").rename(mixed / "test" / "other")
    with pytest.raises(ValueError, match=r"train/ has \['class0', 'class1'\], test/ has \['class0', 'other'\]"):
        prepare.prepare(f"folder:{mixed}", str(tmp_path / "never"), 10)
    assert not (tmp_path / "never").exists()  # checked before anything is written


def test_the_light_record_reader_reads_what_tensorflow_writes(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    example = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x89PNG..."])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[-3]))}))
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b'{"header": 1}')
        writer.write(example.SerializeToString())
        writer.write(records.encode_example(b"abc", 7))
    file = records.RecordFile(path)
    assert len(file) == 3 and records.read_first_record(path) == b'{"header": 1}'
    assert records.parse_example(file.read(1)) == (b"\x89PNG...", -3)
    parsed = tf.io.parse_single_example(file.read(2), {"image": tf.io.FixedLenFeature([], tf.string),
                                                        "label": tf.io.FixedLenFeature([], tf.int64)})
    assert (parsed["image"].numpy(), int(parsed["label"])) == (b"abc", 7)  # TensorFlow reads ours
    (tmp_path / "cut.tfrecord").write_bytes(open(path, "rb").read()[:-5])
    with pytest.raises(ValueError, match="is truncated"):
        records.RecordFile(tmp_path / "cut.tfrecord")


# ---- training, evaluating and preparing from the command line ----

def test_train_and_evaluate_stream_a_folder_of_split_folders_and_shards(folder, shard_set, tmp_path, capsys):
    args = ["train", "--epochs", "1", "--batch-size", "16", *TINY_ARGS]
    assert cli.main([*args, "--data", f"folder:{folder}", "--stream", "--out", str(tmp_path / "folder")]) == 0
    out = capsys.readouterr().out
    assert "input: streamed from disk: 68 images decode to" in out and "--stream (input_mode='stream') asked" in out
    config = json.loads((tmp_path / "folder" / "config.json").read_text())
    assert config["completed"] and config["train_examples"] == 64 and config["steps_per_epoch"] == 4
    assert cli.main([*args, "--data", f"shards:{shard_set}", "--out", str(tmp_path / "shards")]) == 0
    assert "input: in memory: 68 images decode to" in capsys.readouterr().out  # small: in memory
    model = str(tmp_path / "shards" / "model.keras")  # at the shards' size (the folder's run decoded at 32x32)
    reports = []
    for flags in ([], ["--stream"]):
        assert cli.main(["evaluate", model, "--data", f"shards:{shard_set}", *flags]) == 0
        reports.append(capsys.readouterr().out.split("\n", 2)[2])  # after the summary and the input lines
    assert reports[0] == reports[1] and "(4 images)" in reports[0]  # the same numbers streamed or in memory
    assert cli.main([*args, "--data", f"shards:{shard_set}", "--image-size", "16", "--out", str(tmp_path / "x")]) == 2
    assert "they hold 10x12 images, but the model takes 16x16" in capsys.readouterr().err
    assert cli.main([*args, "--data", "fashion_mnist", "--stream", "--out", str(tmp_path / "y")]) == 2
    assert "`input_mode`='stream' streams 'folder:PATH' and 'shards:PATH' data" in capsys.readouterr().err


def test_prepare_from_the_command_line(folder, tmp_path, capsys):
    out = tmp_path / "jpeg"
    assert cli.main(["prepare", "--data", f"folder:{folder}", "--out", str(out), "--image-size", "8",
                     "--encoding", "jpeg"]) == 0
    assert "Train on them with --data shards:" in capsys.readouterr().out
    assert datasets.load_dataset(f"shards:{out}", "val").images.shape == (4, 8, 8, 1)
    assert cli.main(["prepare", "--data", "fashion_mnist", "--out", str(tmp_path / "z"), "--image-size", "8"]) == 2
    assert "`data` must be 'folder:PATH'" in capsys.readouterr().err


# ---- several workers: each reads only its own files ----

WORKER = """
import json, sys
import numpy as np
from vit_keras.training import inputs, train
from vit_keras.data import sources, stream
from vit_keras.data.augmentation import NO_AUGMENTATION, Batching
strategy = train.get_strategy("multi_worker")
seen = {}
for spec in sys.argv[2:]:
    data = sources.list_split(spec, "train", image_size=(10, 12))
    batching = Batching(2, (10, 12), 1, 16, training=True)
    dataset, steps = stream.distributed_stream(strategy, inputs.pipeline_count(strategy), data, batching,
                                               NO_AUGMENTATION)
    batches, seen[spec] = iter(dataset), []
    for _ in range(steps):  # one epoch
        for part in strategy.experimental_local_results(next(batches)[0]):
            seen[spec] += np.round(part.numpy()[:, 0, 0, 0] / 3).astype(int).tolist()
json.dump(dict(seen=seen, steps=steps), open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_two_workers_each_stream_their_own_files_and_see_every_image_once(folder, shard_set, tmp_path):
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:  # hold every port until all are chosen
        s.bind(("127.0.0.1", 0))
    workers = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    specs = [f"folder:{folder}", f"shards:{shard_set}"]
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        processes.append(subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / f"{index}.json"), *specs],
                                          cwd=ROOT, env={**os.environ, "TF_CONFIG": tf_config},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
    results = [json.loads((tmp_path / f"{index}.json").read_text()) for index in range(2)]
    assert all(result["steps"] == 4 for result in results)  # 64 images, 16 a step, 8 from each worker
    for spec in specs:
        first, second = (result["seen"][spec] for result in results)
        assert len(first) == len(second) == 32 and not set(first) & set(second)  # no image read twice
        assert sorted(first + second) == list(range(64))  # none skipped: one worker's epoch


JAX_RUN = """
import json, sys
from vit_keras.training import train
config = train.train(sys.argv[1], sys.argv[2], input_mode="stream", epochs=1, batch_size=16, distill="none",
                     jit_compile=True, verbose=0, tensorboard=False,
                     model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1))
print(json.dumps(dict(steps=config["steps_per_epoch"], completed=config["completed"],
                      pipelines=sorted(m for m in sys.modules if m.startswith("vit_keras.data.stream")))))
"""


def test_jax_streams_shards_through_the_light_record_reader(shard_set, tmp_path):
    result = subprocess.run([sys.executable, "-c", JAX_RUN, f"shards:{shard_set}", str(tmp_path / "run")], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "input: streamed from disk: 68 images" in result.stdout
    outcome = json.loads(result.stdout.strip().splitlines()[-1])  # not tf.data's stream: a PyDataset's
    assert outcome == dict(steps=4, completed=True, pipelines=["vit_keras.data.stream_batches"])


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_limit_says_what_it_kept_once_in_memory_or_streamed(tmp_path, capsys, mode):
    root = numbered_folder(tmp_path / "set", count=40)
    (train,), chosen, _ = sources.load_splits(f"folder:{root}", ("train",), mode, limit=10, whole_folder=True,
                                              image_size=(10, 12))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("limit 10")]
    assert chosen == mode and len(train) == 10 and lines == [
        "limit 10 (seed 0, class-balanced): kept 10 of 40 images, 5 of each of 2 classes"]
