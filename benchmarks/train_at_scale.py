"""The training command at ViT scale, measured whole, as a user runs it (docs/training.md#training-at-224-px-memory).

Runs `vit-keras train --data folder:PHOTOS --model vit_ti16 --image-size 224 --epochs 1` (stdout to a pipe, as
in a log) under each backend, samples the RSS of its whole process tree every second, and prints, for each run: the
seconds to its first step (its first progress line), its peak RSS and where in the run it was reached, its
images/s from its progress lines, and how it ended. --minutes stops a run after that long (its figures so far);
without it each runs to its end. --compare-limit N adds the same command on an in-memory N-image subset
(`--limit N --in-memory`), the reference for the streamed images/s. --kill-after S kills a streamed run (SIGKILL)
S seconds after its first step and reruns the same command: the rerun must say where it resumes and finish with one
history row an epoch.

    python benchmarks/train_at_scale.py --data /path/cifar10/train --backends tensorflow,jax --minutes 6 \
        --compare-limit 2000 --kill-after 200 --out /tmp/scale
"""

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time

PROGRESS = re.compile(r"epoch \d+/\d+: ([\d,]+) of ([\d,]+) images.*?(?:([\d.]+) img/s|first step)")


def tree_rss(pid):
    """Resident bytes of ``pid`` and every process below it."""
    total, stack, seen = 0, [pid], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    stack += [int(child) for child in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total


def run(command, env, minutes=None, kill_after=None, log=None, cwd=None):
    """Run ``command``; returns its figures (first step s, peak RSS, img/s, exit code, resumed line, output)."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                               start_new_session=True)
    peak, first = [0, 0.0], [None]

    def sample():
        while process.poll() is None:
            rss = tree_rss(process.pid)
            if rss > peak[0]:
                peak[:] = [rss, time.monotonic() - start]
            elapsed = time.monotonic() - start
            if minutes and elapsed > minutes * 60 or kill_after and first[0] and elapsed > first[0] + kill_after:
                os.killpg(process.pid, signal.SIGKILL)
            time.sleep(1)

    threading.Thread(target=sample, daemon=True).start()
    rates, lines, resumed = [], [], None
    for line in process.stdout:
        lines.append(line)
        if log:
            log.write(f"[{time.monotonic() - start:7.1f}s {peak[0] / 1e9:5.2f} GB] {line}")
            log.flush()
        match = PROGRESS.search(line)
        if match and first[0] is None:
            first[0] = time.monotonic() - start
        if match and match.group(3):
            rates.append(float(match.group(3)))
        if line.startswith("resuming at"):
            resumed = line.strip()
    code = process.wait()
    return dict(first_step_s=first[0], peak_gb=peak[0] / 1e9, peak_at_s=peak[1], img_per_s=rates[-1] if rates else None,
                rc=code, seconds=time.monotonic() - start, resumed=resumed, output="".join(lines))


def history_rows(folder):
    try:
        with open(os.path.join(folder, "history.csv")) as f:
            return [row["epoch"] for row in csv.DictReader(f)]
    except OSError:
        return []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder of photos, one sub-folder a class")
    parser.add_argument("--backends", default="tensorflow,jax")
    parser.add_argument("--minutes", type=float, default=None, help="stop each run after this long")
    parser.add_argument("--compare-limit", type=int, default=None, help="also train on an in-memory N-image subset")
    parser.add_argument("--kill-after", type=float, default=None, help="SIGKILL S seconds after the first step, rerun")
    parser.add_argument("--out", default="/tmp/train_at_scale")
    args = parser.parse_args()
    vit_keras = os.path.join(os.path.dirname(sys.executable), "vit-keras")
    base = [vit_keras, "train", "--data", f"folder:{args.data}", "--model", "vit_ti16", "--image-size", "224",
            "--epochs", "1"]
    rows = []
    for backend in args.backends.split(","):
        env = dict(os.environ, KERAS_BACKEND=backend)
        runs = [("streamed", base, None)]
        if args.compare_limit:
            runs.append((f"in memory, {args.compare_limit:,} images",
                         base + ["--limit", str(args.compare_limit), "--in-memory"], None))
        if args.kill_after:
            runs.append(("killed, then rerun", base + ["--backup-every", "1min"], args.kill_after))
        for name, command, kill in runs:
            out = os.path.join(args.out, backend, name.split(",")[0].replace(" ", "_"))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out + ".log", "a") as log:
                figures = run(command + ["--out", out, "--overwrite"], env, args.minutes, kill, log)
                if kill:  # the rerun: the same command, resuming
                    figures = run(command + ["--out", out], env, args.minutes, None, log)
                    figures["history"] = history_rows(out)
            rows.append((backend, name, figures))
            print(f"{backend:10s} {name:28s} first step {figures['first_step_s'] or float('nan'):6.1f} s  peak "
                  f"{figures['peak_gb']:5.2f} GB (at {figures['peak_at_s']:.0f} s)  "
                  f"{figures['img_per_s'] or float('nan'):6.1f} img/s  rc {figures['rc']}  {figures['seconds']:.0f} s"
                  + (f"  {figures['resumed']}; history rows {figures.get('history')}" if kill else ""), flush=True)


if __name__ == "__main__":
    main()
