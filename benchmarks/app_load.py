"""Load test for `vit-keras serve`: N concurrent classification requests through Gradio's HTTP API.

    python benchmarks/app_load.py MODEL.tflite [--requests 50] [--concurrency 50] [--rounds 3]
    python benchmarks/app_load.py --url http://127.0.0.1:7860/ --pid PID   # a server already running

Starts the server itself unless --url is given, uploads one real image per request (Fashion-MNIST
test images and foolbox photos, cycled), and prints p50/p99 latency, errors and the server's RSS
(Linux /proc) before and after each round. The server is warmed up with one request first.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _post(url, body, headers, timeout=120):
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def upload(base, path):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{Path(path).name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + Path(path).read_bytes() + \
        f"\r\n--{boundary}--\r\n".encode()
    return json.loads(_post(base + "gradio_api/upload", body,
                            {"Content-Type": f"multipart/form-data; boundary={boundary}"}))[0]


def classify(base, path, session=None):
    """One request the way the page makes it: upload, then call the upload event; returns (seconds, status).

    ``session``: the caller's session hash; a browser tab keeps one for all its requests.
    """
    start = time.perf_counter()
    server_path = upload(base, path)
    file_data = {"path": server_path, "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}}
    event = json.loads(_post(base + "gradio_api/call/classify_upload", json.dumps({"data": [file_data], "session_hash": session}).encode(),
                             {"Content-Type": "application/json"}))["event_id"]
    with urllib.request.urlopen(f"{base}gradio_api/call/classify_upload/{event}", timeout=120) as response:
        text = response.read().decode()
    elapsed = time.perf_counter() - start
    if "event: complete" not in text:
        raise RuntimeError(text[-300:])
    data = json.loads(text.split("event: complete", 1)[1].split("data:", 1)[1].strip())
    status = data[2]
    if "Error" in status:
        raise RuntimeError(status)
    return elapsed, status


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, workers):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "vit_keras.apps.cli", "serve", model, "--port", str(port),
                                "--workers", str(workers)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    for _ in range(240):
        try:
            urllib.request.urlopen(base + "config", timeout=2)
            return process, base
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("the server exited while starting") from None
            time.sleep(0.5)
    process.kill()
    raise TimeoutError("the server did not start in 120 s")


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="a .tflite to serve (omit with --url)")
    parser.add_argument("--url", help="an already running server")
    parser.add_argument("--pid", type=int, help="its process id, for RSS")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="server inference workers (when started here)")
    args = parser.parse_args(argv)
    if not args.model and not args.url:
        parser.error("give MODEL.tflite or --url")

    from vit_keras.apps.examples import bundled_examples

    images = [path for path, _ in bundled_examples()]
    process = None
    if args.url:
        base, pid = args.url.rstrip("/") + "/", args.pid
    else:
        process, base = start_server(args.model, args.workers)
        pid = process.pid
    try:
        sessions = [uuid.uuid4().hex[:11] for _ in range(args.concurrency)]
        classify(base, images[0], sessions[0])  # warm-up
        report = {"requests_per_round": args.requests, "concurrency": args.concurrency, "rounds": []}
        for round_index in range(args.rounds):
            before = rss_mb(pid) if pid else float("nan")
            errors, latencies = [], []
            wall = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                # Each of the `concurrency` clients keeps its session across rounds, like an open browser tab.
                futures = [pool.submit(classify, base, images[i % len(images)], sessions[i % args.concurrency])
                           for i in range(args.requests)]
                for future in futures:
                    try:
                        latencies.append(future.result()[0] * 1000)
                    except Exception as error:  # counted, reported
                        errors.append(str(error)[:200])
            wall = time.perf_counter() - wall
            after = rss_mb(pid) if pid else float("nan")
            row = {"round": round_index + 1, "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
                   "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
                   "throughput_per_s": round(len(latencies) / wall, 1), "errors": len(errors),
                   "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1)}
            report["rounds"].append(row)
            print(f"round {row['round']}: {args.requests} requests, {args.concurrency} concurrent: "
                  f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, {row['throughput_per_s']}/s, "
                  f"errors {row['errors']}, RSS {row['rss_before_mb']} -> {row['rss_after_mb']} MB", flush=True)
            for error in errors[:3]:
                print("  error:", error)
        rounds = report["rounds"]
        report["rss_growth_mb_after_first_round"] = round(rounds[-1]["rss_after_mb"] - rounds[0]["rss_after_mb"], 1)
        report["total_errors"] = sum(r["errors"] for r in rounds)
        print(json.dumps(report))
        return 1 if report["total_errors"] else 0
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
