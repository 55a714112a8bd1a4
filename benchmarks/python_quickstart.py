"""The README's Python fine-tuning quickstart, run as a user runs it, at full scale: does it reach what the CLI does
(docs/finetuning.md, "Fine-tuning in Python")?

Takes the first ```python block under README.md's "Fine-tune in Python" heading, as written, and runs it in a fresh
interpreter whose working folder holds ``cifar10`` (a link to DATA: train/ and test/, one sub-folder a class).
``keras.Model.fit`` is timed by a wrapper (nothing else changes). Prints the block's lines of code, the recipe it
chose (image size, why, the estimate), the fit's minutes against the estimate, the last validation accuracy (DATA's
test/), the whole run's seconds and its peak RSS.

    VIT_KERAS_WEIGHTS_MIRROR=/path/mirror python benchmarks/python_quickstart.py --data /path/cifar10 [--backend jax]
"""

import argparse
import json
import os
import re
import sys
import tempfile

from train_at_scale import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADING = "Fine-tune in Python"

PRELUDE = """
import json, time, keras
FITS = []
_fit = keras.Model.fit
def _timed_fit(self, *args, **kwargs):
    start = time.perf_counter()
    history = _fit(self, *args, **kwargs)
    FITS.append(dict(seconds=time.perf_counter() - start, history=history.history))
    return history
keras.Model.fit = _timed_fit
"""
EPILOGUE = """
print("QUICKSTART " + json.dumps(dict(fits=FITS, recipe=str(recipe), estimate=recipe.estimated_seconds)))
"""


def quickstart_block(readme):
    """The first ```python block after the heading that names ``HEADING``."""
    after = readme[readme.index(HEADING):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def code_lines(block):
    return [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder with train/ and test/, one sub-folder a class")
    parser.add_argument("--backend", default="tensorflow", help="KERAS_BACKEND (default tensorflow)")
    parser.add_argument("--log", default="/tmp/python_quickstart.log", help="the run's whole output")
    args = parser.parse_args()
    with open(os.path.join(ROOT, "README.md")) as f:
        block = quickstart_block(f.read())
    print(f"the README's block: {len(code_lines(block))} lines of code")
    with tempfile.TemporaryDirectory() as work:
        os.symlink(os.path.abspath(args.data), os.path.join(work, "cifar10"))
        script = os.path.join(work, "quickstart.py")
        with open(script, "w") as f:
            f.write(PRELUDE + block + EPILOGUE)
        with open(args.log, "w") as log:
            figures = run([sys.executable, script], dict(os.environ, KERAS_BACKEND=args.backend), log=log, cwd=work)
    found = [line for line in figures["output"].splitlines() if line.startswith("QUICKSTART ")]
    if not found:
        print(f"the block did not finish (rc {figures['rc']}); see {args.log}")
        return 1
    result = json.loads(found[-1][len("QUICKSTART "):])
    print(result["recipe"])
    seconds = sum(fit["seconds"] for fit in result["fits"])
    estimate = result["estimate"]
    print(f"fit: {seconds / 60:.1f} min" + (f", against {estimate / 60:.1f} min estimated ({seconds / estimate - 1:+.0%})"
                                            if estimate else ""))
    history = result["fits"][-1]["history"]
    print("validation accuracy by epoch: " + ", ".join(f"{v:.2%}" for v in history.get("val_accuracy", [])))
    print(f"whole run: {figures['seconds']:.0f} s, peak RSS {figures['peak_gb']:.2f} GB, rc {figures['rc']}")
    return 0 if figures["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
