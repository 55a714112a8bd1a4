"""Every ```python block of README.md and docs/*.md runs, as a reader would paste it.

Each .md file's blocks run in order in one fresh Python process (a later block may use an earlier one's names), in
a temporary folder that holds small stand-ins for what the examples name, so nothing is downloaded and every block
takes seconds:
- ``cifar10/train`` and ``cifar10/test``: CIFAR-10's 10 class folders with 4 and 1 generated 32x32 PNGs each;
  ``photo.png``, one more.
- ``fashion_mnist``: 40 training and 20 test images in Fashion-MNIST's IDX files (``VIT_KERAS_FASHION_MNIST_DIR``).
- Every preset (by name, alias or URL) a file's blocks name: a seeded random checkpoint in Google's layout, of the
  preset's architecture, image size and classes, in a folder mirror at the path its URL maps to
  (``VIT_KERAS_WEIGHTS_MIRROR``; ``VIT_KERAS_CACHE`` is a temporary folder too).
- ``SMALL``: the run's length. A block's calls of ``vit_keras.finetune_recipe`` and ``vit_keras.training.train.train``
  get these keywords where the block leaves them unset (so a fine-tune is 5 steps at 64 px without XLA, not 300
  at the size a warm-up chooses); everything else runs as written. The warm-up, XLA and the recipe's full length are
  tested elsewhere (tests/test_finetune.py, the CLI's tests).

A block that cannot run here (it needs a GPU, the network, a real dataset) is marked in the .md on the line right
before its fence, ``<!-- docs-test: skip: REASON -->``; each such block is reported as a skipped test with its
reason. The README's fine-tuning quickstart may not be skipped.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP_MARK = re.compile(r"^<!--\s*docs-test:\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")

# The keywords each call gets where a block leaves them unset (see the module doc).
SMALL = {
    "vit_keras.training.api.finetune_recipe": dict(image_size=64, epochs=1, min_steps=2, batch_size=8,
                                                   jit_compile=False),
    "vit_keras.training.train.train": dict(min_steps=2, teacher_steps=2, batch_size=8, jit_compile=False),
}
CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
FASHION_IMAGES = {"train": 40, "t10k": 20}
TIMEOUT_S = 400


def python_blocks(path):
    """[(line of the fence, code, skip reason or None)] of a Markdown file's ```python blocks."""
    lines, blocks, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])), None)
        assert end is not None, f"{path.name}:{i + 1}: a code fence that never closes"
        if match.group(1) == "python":
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = SKIP_MARK.match(before.strip())
            blocks.append((i + 1, "\n".join(lines[i + 1:end]) + "\n", mark.group("reason") if mark else None))
        i = end + 1
    return blocks


def name(path):
    return str(path.relative_to(ROOT))


RUN = [(name(p), p) for p in DOCS if any(reason is None for _, _, reason in python_blocks(p))]
SKIPPED = [(f"{name(p)}:{line}", reason) for p in DOCS for line, _, reason in python_blocks(p) if reason]

PRELUDE = '''
import functools, json, sys, time

import vit_keras.training.api
import vit_keras.training.train


def small(module, function_name, keywords):
    """tests/test_docs.py's SMALL: ``keywords`` where the caller leaves them unset."""
    function = getattr(module, function_name)

    @functools.wraps(function)
    def call(*args, **kwargs):
        return function(*args, **{**keywords, **kwargs})

    setattr(module, function_name, call)


for qualified, keywords in json.loads(sys.argv[2]).items():
    module_name, _, function_name = qualified.rpartition(".")
    small(sys.modules[module_name], function_name, keywords)

namespace = {"__name__": "__main__"}
for where, first_line, code in json.loads(open(sys.argv[1]).read()):
    print(f"docs-test: {where}", flush=True)
    start = time.perf_counter()
    path, _, _ = where.rpartition(":")
    exec(compile("\\n" * first_line + code, path, "exec"), namespace)  # tracebacks give the .md's own lines
    print(f"docs-test: {where} ran in {time.perf_counter() - start:.1f} s", flush=True)
'''


# ----------------------------------------------------------------------------- the stand-ins


def write_png(path, rng, size=32):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    base = rng.integers(0, 256, (1, 1, 3))
    noise = rng.integers(-40, 40, (size, size, 3))
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(path)


def write_idx(path, array):
    import gzip

    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_workdir(work):
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("test", 1)):
        for class_name in CIFAR10:
            for i in range(count):
                write_png(work / "cifar10" / split / class_name / f"{i}.png", rng)
    write_png(work / "photo.png", rng, size=64)
    fashion = work.parent / "fashion-mnist"
    fashion.mkdir(exist_ok=True)
    for prefix, count in FASHION_IMAGES.items():
        write_idx(fashion / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        write_idx(fashion / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)
    return fashion


def named_presets(code):
    """The presets a block names: string literals that are a preset's name or alias, or its URL."""
    import ast

    from vit_keras.weights.fetch import split_url
    from vit_keras.weights.presets import PRESETS, find_preset

    by_url = {preset.url: preset for preset in PRESETS}
    found = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            preset = find_preset(text) or (by_url.get(split_url(text)[0]) if re.match(r"(https?|gs)://", text)
                                           else None)
            if preset is not None:
                found[preset.name] = preset
    return list(found.values())


def write_checkpoint(preset, mirror):
    """A seeded random checkpoint in Google's layout for ``preset``, where the mirror keeps its URL."""
    import weight_checkpoints  # tests/ is on the path, as for conftest's helpers

    from vit_keras.models.configs import model_config
    from vit_keras.weights.fetch import mirror_location

    path = Path(mirror_location(preset.url, str(mirror)))
    if path.exists():
        return
    config = model_config(preset.model)
    assert config["stem"] is None, f"{preset.name}: the docs test writes plain ViT checkpoints only"
    patch, grid = config["patch_size"], preset.image_size // config["patch_size"]
    seed = int(hashlib.sha256(preset.name.encode()).hexdigest()[:8], 16)
    arrays = weight_checkpoints.random_vit(
        np.random.RandomState(seed), patch, 3, config["hidden_size"], config["num_heads"], config["mlp_dim"],
        config["num_layers"], grid * grid + 1, preset.num_classes, representation=preset.representation_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # an .npz whatever the URL's ending: the loader reads a file by its content
        np.savez(f, **arrays)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    work = root / "work"
    work.mkdir()
    fashion = make_workdir(work)
    yield dict(root=root, work=work, fashion=fashion, mirror=root / "mirror")
    shutil.rmtree(root, ignore_errors=True)  # full-size stand-in checkpoints: over a gigabyte


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.parametrize("doc", [path for _, path in RUN], ids=[label for label, _ in RUN])
def test_doc_examples_run(doc, stand_ins):
    blocks = [(f"{name(doc)}:{line}", line, code) for line, code, reason in python_blocks(doc) if reason is None]
    for _, _, code in blocks:
        for preset in named_presets(code):
            write_checkpoint(preset, stand_ins["mirror"])
    listing = stand_ins["root"] / (doc.stem + "_blocks.json")
    listing.write_text(json.dumps(blocks))
    driver = stand_ins["root"] / "run_blocks.py"
    driver.write_text(textwrap.dedent(PRELUDE))
    env = dict(os.environ, VIT_KERAS_WEIGHTS_MIRROR=str(stand_ins["mirror"]),
               VIT_KERAS_CACHE=str(stand_ins["root"] / "cache"), VIT_KERAS_FASHION_MNIST_DIR=str(stand_ins["fashion"]),
               MPLBACKEND="Agg", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(driver), str(listing), json.dumps(SMALL)], cwd=stand_ins["work"],
                            env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    ran = [line for line in result.stdout.splitlines() if line.startswith("docs-test:")]
    assert result.returncode == 0, (f"{name(doc)}: a python block failed after\n" + "\n".join(ran)
                                    + "\n--- stderr (end) ---\n" + result.stderr[-5000:])
    print("\n".join(ran))


@pytest.mark.parametrize("where, reason", SKIPPED, ids=[where for where, _ in SKIPPED])
def test_doc_example_skipped(where, reason):
    pytest.skip(f"{where}: {reason} (marked <!-- docs-test: skip: ... -->)")


def test_the_readme_quickstart_is_run():
    quickstart = [reason for _, code, reason in python_blocks(ROOT / "README.md") if "finetune_recipe" in code]
    assert quickstart and None in quickstart, "the README's fine-tuning quickstart must run in the docs test"


def test_skip_marks_sit_right_before_a_python_block():
    for path in DOCS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "docs-test:" in line:
                assert SKIP_MARK.match(line.strip()), f"{name(path)}:{i + 1}: write <!-- docs-test: skip: REASON -->"
                after = next((lines[j] for j in range(i + 1, len(lines)) if lines[j].strip()), "")
                assert after.strip() == "```python", f"{name(path)}:{i + 1}: a skip mark must precede a ```python fence"


def heading_anchors(path):
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped, spaces to hyphens;
    a repeated one gets -1, -2, ...)."""
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            anchor = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_links_between_the_docs_resolve():
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{name(path)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
                broken.append(f"{name(path)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
