"""The browser as a device: a static site that classifies with a .tflite in the visitor's own browser.

``export_site`` writes index.html (rendered from apps/site/), the page's script and style, the model, and
MediaPipe Tasks Vision for Web's JavaScript and WebAssembly, copied from the npm install that scripts/setup.sh
makes (`npm ci`, pinned with its integrity hash in package-lock.json). MediaPipe's ImageClassifier reads the labels
and the normalization from the file's metadata, as Android's does. The page resizes each image to the model's input
size (written into index.html) itself, as the app and training resize (site/resize.js): MediaPipe's own resize does
not antialias. Any static file server can host the folder; ``serve_site`` is one (`vit-keras serve MODEL
--in-browser`).
"""

import html
import http.server
import json
import os
import shutil
import signal
import string
import tempfile
import threading
from functools import partial
from pathlib import Path

from vit_keras.files import atomic_path, write_text

from .images import MAX_PIXELS
from .model_info import read_model_info

RUNTIME_PACKAGE = "@mediapipe/tasks-vision"
RUNTIME_VERSION = "1.1.0"  # package.json pins the same; a test holds them equal
# What the page loads of the package: the ES module and the SIMD WebAssembly build with its loader.
RUNTIME_FILES = ("vision_bundle.mjs", "wasm/vision_wasm_internal.js", "wasm/vision_wasm_internal.wasm")
RUNTIME_FOLDER = "mediapipe"  # under the site
SITE_TEMPLATES = Path(__file__).resolve().parent / "site"
SITE_STATIC = ("app.js", "resize.js", "style.css")  # copied as they are; index.html is rendered
SITE_MODEL = "model.tflite"
MAX_FILE_MEGABYTES = 50  # the page refuses larger files before reading them: a phone's memory is small
SETUP_STEP = "scripts/setup.sh (its `npm ci` step)"


def default_runtime_dir():
    """Where `npm ci` at the repository root installs the runtime (node_modules is ignored by git)."""
    return Path(__file__).resolve().parents[1] / "node_modules" / RUNTIME_PACKAGE


def check_model(path):
    """The ModelInfo of a .tflite that MediaPipe's ImageClassifier can read, or a clear error."""
    path = Path(path)
    if path.suffix.lower() != ".tflite":
        hint = " (a Keras model: make a .tflite with `vit-keras export` first)" if path.suffix == ".keras" else ""
        raise ValueError(f"MODEL must be a .tflite file, got {str(path)!r}{hint}")
    if not path.is_file():
        raise FileNotFoundError(f"no such model file: {path}")
    try:
        info = read_model_info(path.read_bytes())
    except ValueError as error:
        raise ValueError(f"{path} is not a usable .tflite model: {error}") from None
    if not info.has_metadata:
        raise ValueError(f"{path} carries no TFLite metadata: the page's ImageClassifier reads the labels and the "
                         "normalization from it. Export the model with `vit-keras export`.")
    if not info.labels:
        raise ValueError(f"{path}'s metadata has no labels file (TENSOR_AXIS_LABELS): the page could show only "
                         "class numbers. Export the model with `vit-keras export` (it reads labels.txt).")
    if info.color_space not in (None, "RGB"):  # MediaPipe: "Only RGB color space is supported for now"
        raise ValueError(f"{path} takes {info.color_space} input; MediaPipe's ImageClassifier reads RGB-input models "
                         "only. Files from `vit-keras export` take RGB, also for a grayscale model.")
    if not info.image_size:
        raise ValueError(f"{path}'s metadata gives no input image size (ImageProperties.default_size): the page "
                         "resizes each image to it. Export the model with `vit-keras export`.")
    return info


def check_web_runtime(runtime_dir=None):
    """The folder of the npm package, holding every file the page loads, at the pinned version."""
    folder = Path(runtime_dir) if runtime_dir else default_runtime_dir()
    missing = [name for name in RUNTIME_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the in-browser runtime is not installed: {folder / missing[0]} is missing. Run {SETUP_STEP}, which "
            f"installs {RUNTIME_PACKAGE} {RUNTIME_VERSION} from package-lock.json, or pass --runtime-dir with an "
            f"npm install of {RUNTIME_PACKAGE}@{RUNTIME_VERSION}.")
    try:
        version = json.loads((folder / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        version = None
    if version != RUNTIME_VERSION:
        raise ValueError(f"{folder} holds {RUNTIME_PACKAGE} {version or '(unknown version)'}; the page is made "
                         f"for {RUNTIME_VERSION}. Run {SETUP_STEP}.")
    return folder


def check_out_dir(out, force=False):
    """Refuses a file, or a folder that is not empty unless ``force``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        entries = len(list(out.iterdir()))
        raise ValueError(f"--out {out} is not empty ({entries} entries); pass --force to write the site into it "
                         "(files of the same names are replaced, others are left)")


def render_index(info, model_bytes, top_k):
    """index.html for the model: its name and description from the metadata, the page's settings."""
    height, width = info.image_size
    details = (f"input {height}×{width} {info.color_space or ''}".rstrip() + f" · {len(info.labels)} classes · "
               f"{model_bytes / 1e6:.2f} MB")
    values = {"name": info.name or "(unnamed model)",
              "description": info.description or "(no description in the model's metadata)",
              "details": details, "model": SITE_MODEL, "top_k": top_k, "max_pixels": MAX_PIXELS,
              "max_megabytes": MAX_FILE_MEGABYTES, "runtime_version": RUNTIME_VERSION,
              "input_width": width, "input_height": height}
    template = string.Template((SITE_TEMPLATES / "index.html").read_text())
    return template.substitute({key: html.escape(str(value), quote=True) for key, value in values.items()})


def copy_atomic(source, target):
    with atomic_path(target) as temp:
        shutil.copyfile(source, temp)


def export_site(model, out, force=False, top_k=5, runtime_dir=None):
    """Writes the site for ``model`` into ``out``; every check runs before anything is written.

    Returns {"path", "files", "bytes", "name"}.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    info = check_model(model)
    runtime = check_web_runtime(runtime_dir)
    check_out_dir(out, force)
    out = Path(out)
    model_bytes = Path(model).stat().st_size
    write_text(out / "index.html", render_index(info, model_bytes, top_k))
    for name in SITE_STATIC:
        copy_atomic(SITE_TEMPLATES / name, out / name)
    copy_atomic(model, out / SITE_MODEL)
    for name in RUNTIME_FILES:
        copy_atomic(runtime / name, out / RUNTIME_FOLDER / name)
    files = ["index.html", *SITE_STATIC, SITE_MODEL, *(f"{RUNTIME_FOLDER}/{name}" for name in RUNTIME_FILES)]
    return {"path": str(out), "files": files, "bytes": sum((out / name).stat().st_size for name in files),
            "name": info.name}


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    """A plain static file server; module scripts and WebAssembly need their MIME types on any machine."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".js": "text/javascript", ".wasm": "application/wasm", ".tflite": "application/octet-stream"}


def start_site_server(folder, host="127.0.0.1", port=0):
    """A threading static server for ``folder``, serving in a daemon thread; returns the server."""
    server = http.server.ThreadingHTTPServer((host, port), partial(SiteHandler, directory=os.fspath(folder)))
    threading.Thread(target=server.serve_forever, name="vit-keras-site", daemon=True).start()
    return server


def serve_site(model, host="127.0.0.1", port=8000, top_k=5, runtime_dir=None):
    """Exports the site for ``model`` into a temporary folder and serves it until interrupted or terminated."""
    with tempfile.TemporaryDirectory(prefix="vit-keras-site-") as folder:
        summary = export_site(model, folder, top_k=top_k, runtime_dir=runtime_dir)
        server = start_site_server(folder, host, port)
        done = threading.Event()
        if threading.current_thread() is threading.main_thread():  # SIGTERM too removes the temporary folder
            signal.signal(signal.SIGTERM, lambda *_: done.set())
        print(f"vit-keras serve: {summary['name']} in the browser on http://{host}:{server.server_port}/",
              flush=True)
        try:
            while not done.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
