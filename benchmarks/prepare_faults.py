"""`vit-keras prepare` at scale, killed at random points, resumed, and trained from (docs/benchmarks.md).

    .venv/bin/python benchmarks/prepare_faults.py --data folder:/work/data/cifar10 --image-size 32 --kills 3

Writes an uninterrupted reference set, then a second set that is SIGKILLed ``--kills`` times at random moments
(seeded) and rerun each time, then run to its end; prints each kill's moment and how many shards the rerun kept,
checks that both sets are the same bytes, file by file, and trains one epoch from the resumed set.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare_command(data, out, size):
    return [sys.executable, "-m", "vit_keras.apps.cli", "prepare", "--data", data, "--out", out, "--image-size",
            str(size)]


def shards(out):
    return sorted(n for n in os.listdir(out) if n.endswith(".tfrecord") and not n.startswith(".")) \
        if os.path.isdir(out) else []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="prepare_faults_")
    reference, resumed = os.path.join(work, "reference"), os.path.join(work, "resumed")
    for folder in (reference, resumed):
        shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(prepare_command(args.data, reference, args.image_size), check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    whole = time.perf_counter() - start
    total = len(shards(reference))
    print(f"uninterrupted: {total} shards in {whole:.0f} s")
    rng = random.Random(args.seed)
    for kill in range(args.kills):
        before = len(shards(resumed))
        process = subprocess.Popen(prepare_command(args.data, resumed, args.image_size), cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        moment = rng.uniform(0.15, 0.6) * whole
        time.sleep(moment)
        process.kill()
        output = process.communicate()[0]
        kept = [line for line in output.splitlines() if " kept " in line]
        print(f"kill {kill + 1}: after {moment:.0f} s, {len(shards(resumed))} of {total} shards on disk "
              f"({before} before this run; it said: {'; '.join(kept) or 'nothing kept'})")
    start = time.perf_counter()
    final = subprocess.run(prepare_command(args.data, resumed, args.image_size), cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    print(f"completed in {time.perf_counter() - start:.0f} s: " + "; ".join(
        line for line in final.splitlines() if " kept " in line or line.startswith("Wrote")))
    names = sorted(os.listdir(reference))
    same = names == sorted(os.listdir(resumed)) and all(
        open(os.path.join(reference, n), "rb").read() == open(os.path.join(resumed, n), "rb").read() for n in names)
    print(f"resumed set equals the uninterrupted one, byte for byte: {same} ({len(names)} files)")
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "vit_keras.apps.cli", "train", "--data", f"shards:{resumed}",
                          "--epochs", "1", "--out", os.path.join(work, "run"), "--quiet"], cwd=ROOT,
                         capture_output=True, text=True)
    print(f"train 1 epoch from the resumed shards: rc {run.returncode}, {time.perf_counter() - start:.0f} s; "
          + (run.stdout.strip().splitlines() or ["-"])[-1])
    return 0 if same and run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
