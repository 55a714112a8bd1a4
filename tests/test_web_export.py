"""`vit-keras export-web` tested as a person would: the site is served by a plain static server (`python -m
http.server`) and opened in Debian's Chromium, with every request that leaves 127.0.0.1 refused and recorded."""

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from PIL import Image

from app_models import RGB_VIT, bad_inputs, build_rgb_models, photo_files
from vit_keras.apps.cli import main
from vit_keras.apps.examples import foolbox_data_dir
from vit_keras.apps.web_export import RUNTIME_PACKAGE, RUNTIME_VERSION, check_web_runtime, default_runtime_dir

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
FAKE_CAMERA = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
REPO = Path(__file__).resolve().parents[1]
FASHION_IMAGES = range(8)  # the first Fashion-MNIST test images

RUNTIME_MISSING = not (default_runtime_dir() / "vision_bundle.mjs").is_file()
needs_runtime = pytest.mark.skipif(RUNTIME_MISSING, reason="the npm runtime is not installed: run scripts/setup.sh")
needs_browser = pytest.mark.skipif(RUNTIME_MISSING or not os.path.exists(CHROMIUM),
                                   reason="the npm runtime (scripts/setup.sh) or Debian's chromium is missing")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url, process, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout}s")


@contextmanager
def static_server(folder):
    """`python -m http.server` on 127.0.0.1 for ``folder``: any static host would do."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                                str(folder), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_http(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def wait_until(page, expression, timeout=30):
    """Polls ``expression`` in the page until truthy (wait_for_function evaluates strings, which the CSP forbids)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = page.evaluate(expression)
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"{expression!r} stayed false for {timeout}s")


class SitePage:
    """One tab on the site, whose every request is logged and, when it leaves 127.0.0.1, refused."""

    def __init__(self, browser, url, fake_clock=False, **context_options):
        self.url, self.requests, self.outside, self.console = url, [], [], []
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, **context_options)
        if fake_clock:  # the page's timers and clocks run on, and the test may jump them ahead
            self.context.clock.install()
        self.context.route("**/*", self.route)
        self.page = self.context.new_page()
        self.page.on("console", lambda message: self.console.append(message.text))
        self.page.goto(url)
        self.page.wait_for_selector("body[data-state]", state="attached", timeout=60_000)
        assert self.page.evaluate("document.body.dataset.state") == "ready", self.page.inner_text("#message")

    def route(self, route):
        request_url = route.request.url
        self.requests.append(request_url)
        if urlparse(request_url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.outside.append(request_url)
            route.abort()

    def done(self):
        return int(self.page.evaluate("document.body.dataset.done || '0'"))

    def upload(self, path):
        """Give the page ``path``; returns (lastResult or None when refused, message text)."""
        before = self.done()
        previous = self.page.evaluate("window.lastResult || null")
        self.page.set_input_files("#file", str(path))
        self.page.wait_for_selector(f"body[data-done='{before + 1}']", state="attached", timeout=60_000)
        result = self.page.evaluate("window.lastResult || null")
        message = self.page.inner_text("#message") if self.page.is_visible("#message") else ""
        return (None if result == previous else result), message

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def sites(models, tmp_path_factory):
    """export-web's folder for the int8 and the float32 Fashion-MNIST file."""
    folders = {}
    for mode in ("int8", "float32"):
        folders[mode] = tmp_path_factory.mktemp(f"site_{mode}")
        assert main(["export-web", str(models[mode]), "--out", str(folders[mode]), "--force"]) == 0
    return folders


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + FAKE_CAMERA)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def int8_site(sites, browser):
    with static_server(sites["int8"]) as url:
        page = SitePage(browser, url)
        yield page
        page.close()


def fashion_files(folder, fashion_test):
    images, _ = fashion_test
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"fashion_test_{i}.png" for i in FASHION_IMAGES]
    for i, path in zip(FASHION_IMAGES, paths):
        Image.fromarray(images[i, :, :, 0], "L").save(path)
    return paths


def cli_results(capsys, model, paths):
    assert main(["classify", str(model), *map(str, paths), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["results"]


@pytest.mark.parametrize("mode", ["int8", "float32"])
@needs_browser
def test_page_top1_equals_cli(mode, sites, browser, models, fashion_test, tmp_path, capsys):
    paths = fashion_files(tmp_path, fashion_test)
    expected = cli_results(capsys, models[mode], paths)
    with static_server(sites[mode]) as url:
        site = SitePage(browser, url)
        header = site.page.inner_text("#model-info")
        assert "vit_ti16" in header and f"{mode} TFLite, 10 classes" in header  # name, description: the metadata
        results = [site.upload(path)[0] for path in paths]
        site.page.screenshot(path=str(tmp_path / f"page_{mode}.png"), full_page=True)
        status = site.page.inner_text("#status")
        site.close()
    for path, page, cli in zip(paths, results, expected):
        assert page["source"] == path.name and len(page["labels"]) == 5
        assert page["labels"][0] == cli["top"][0]["label"], path.name
        np.testing.assert_allclose(page["scores"][0], cli["top"][0]["score"], atol=2e-3)
    assert status.startswith(f"{paths[-1].name}: {results[-1]['labels'][0]} (") and " ms in this browser" in status
    latency = sorted(result["ms"] for result in results[1:])  # the first call also sets the graph up
    print(f"\nin-browser {mode}: first {results[0]['ms']:.1f} ms, median {latency[len(latency) // 2]:.1f} ms")
    assert not site.outside and all(request.startswith(url) for request in site.requests)
    assert (tmp_path / f"page_{mode}.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def rgb_sites(tmp_path_factory):
    """A tiny RGB ViT normalized per channel, as {mode: (its .tflite, export-web's folder)} for int8 and float32."""
    models = build_rgb_models(tmp_path_factory.mktemp("rgb_models"))
    sites = {}
    for mode, model in models.items():
        sites[mode] = model, tmp_path_factory.mktemp(f"rgb_site_{mode}")
        assert main(["export-web", str(model), "--out", str(sites[mode][1]), "--force"]) == 0
    return sites


# Under noise of one level on a fifth of its input values, the int8 model's top-1 on a photo scored 0.47 against
# 0.41 changed in 8 of 50 trials; on photos with a margin of 0.8, in none.
JPEG_MARGIN = 0.2


@pytest.mark.parametrize("mode", ["int8", "float32"])
@needs_browser
def test_page_top1_equals_cli_on_photos(mode, rgb_sites, browser, tmp_path, capsys):
    """An RGB model whose per-channel normalization export folds into the graph: the page and the CLI agree on
    real photos of several sizes, which the page resizes to the model's 32 x 32 as classify does (resize.js).

    A PNG reaches the model as the same bytes on both sides, so the scores are the same. A JPEG's reduced-scale
    decode is libjpeg's in the CLI and block means of the full decode in the page, within 2 levels of 255: enough
    to flip an int8 model's top-1 on a near-tie, so the JPEGs here must have a clear winner."""
    from vit_keras.apps.classifier import Classifier

    model, folder = rgb_sites[mode]
    classifier = Classifier(model)
    assert classifier.mean.tolist() == [0.0] and classifier.std.tolist() == [1.0]  # normalized inside the graph
    paths = photo_files(tmp_path)
    expected = cli_results(capsys, model, paths)
    assert len({cli["top"][0]["label"] for cli in expected}) >= 2  # a model that always says one class proves little
    for path, cli in zip(paths, expected):
        if path.suffix == ".jpg":
            margin = cli["top"][0]["score"] - cli["top"][1]["score"]
            assert margin >= JPEG_MARGIN, f"{path.name} is a near-tie for classify ({cli['top'][:2]}): pick another"
    with static_server(folder) as url:
        site = SitePage(browser, url)
        assert f"{mode} TFLite, 10 classes" in site.page.inner_text("#model-info")
        results = [site.upload(path)[0] for path in paths]
        site.page.screenshot(path=str(tmp_path / f"photos_{mode}.png"), full_page=True)
        site.close()
    assert not site.outside and all(request.startswith(url) for request in site.requests)
    assert (tmp_path / f"photos_{mode}.png").stat().st_size > 10_000
    gaps = {}
    for path, page, cli in zip(paths, results, expected):
        assert page["source"] == path.name and len(page["labels"]) == 5
        assert page["labels"][0] == cli["top"][0]["label"], (path.name, page["labels"], cli["top"])
        gaps[path.name] = abs(page["scores"][0] - cli["top"][0]["score"])
        tolerance = 0.05 if path.suffix == ".jpg" else 2e-3
        assert gaps[path.name] <= tolerance, (path.name, page["scores"][0], cli["top"][0]["score"])
    print(f"\nphotos, {mode}: top-1 score, page against classify: max difference {max(gaps.values()):.4f} "
          f"(PNG {max(v for k, v in gaps.items() if k.endswith('.png')):.4f})")


# (width, height) -> the model's (width, height): reduce factors 1 to 6 before the triangle filter, and upscaling.
RESIZE_CASES = {(97, 61): (32, 32), (640, 480): (32, 32), (513, 300): (224, 224), (45, 61): (32, 32),
                (20, 15): (32, 32), (300, 200): (28, 40)}
# Bytes cross into the page and back as base64: Playwright serializes a list element by element, which took minutes.
RESIZE_IN_PAGE = """async ([encoded, width, height, outWidth, outHeight, draft]) => {
  const {jpegDraft, resizeAsPillow} = await import("./resize.js");
  let pixels = {data: Uint8ClampedArray.from(atob(encoded), (c) => c.charCodeAt(0)), width, height};
  if (draft) pixels = jpegDraft(pixels, outWidth, outHeight);
  const out = resizeAsPillow(pixels, outWidth, outHeight).data;
  let binary = "";
  for (let i = 0; i < out.length; i += 8192) binary += String.fromCharCode(...out.subarray(i, i + 8192));
  return [pixels.width, pixels.height, btoa(binary)];
}"""


def resize_in_page(site, rgb, size, draft=False):
    """resize.js in the page on an (H, W, 3) uint8 array: (the size after jpegDraft, the (h, w, 3) result)."""
    rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)
    width, height, encoded = site.page.evaluate(RESIZE_IN_PAGE, [base64.b64encode(rgba.tobytes()).decode("ascii"),
                                                                 rgb.shape[1], rgb.shape[0], *size, draft])
    data = np.frombuffer(base64.b64decode(encoded), np.uint8)
    return (width, height), data.reshape(size[1], size[0], 4)[..., :3]


@needs_browser
def test_page_resizes_as_pillow(rgb_sites, browser, tmp_path):
    """resize.js against Pillow's resize(BILINEAR, reducing_gap=3.0), as classify and training call it: the same
    bytes. A JPEG's reduced-scale decode (draft) the page can only approach with block means, at the same scale."""
    rng = np.random.default_rng(0)
    with Image.open(foolbox_data_dir() / "imagenet_06_609.jpg") as photo:
        photo = photo.convert("RGB")
    with static_server(rgb_sites["int8"][1]) as url:
        site = SitePage(browser, url)
        for (width, height), size in RESIZE_CASES.items():
            for rgb in (rng.integers(0, 256, (height, width, 3), dtype=np.uint8),
                        np.asarray(photo.resize((width, height), Image.LANCZOS))):
                expected = np.asarray(Image.fromarray(rgb).resize(size, Image.BILINEAR, reducing_gap=3.0))
                np.testing.assert_array_equal(resize_in_page(site, rgb, size)[1], expected, err_msg=str(size))
        for (width, height), size in RESIZE_CASES.items():
            path = tmp_path / f"photo_{width}x{height}.jpg"
            photo.resize((width, height), Image.LANCZOS).save(path, quality=90)
            with Image.open(path) as jpeg:
                jpeg.draft("RGB", size)
                drafted = jpeg.size
                expected = np.asarray(jpeg.convert("RGB").resize(size, Image.BILINEAR, reducing_gap=3.0), np.float32)
            with Image.open(path) as jpeg:
                full = np.asarray(jpeg.convert("RGB"))
            decoded, resized = resize_in_page(site, full, size, draft=True)
            gap = np.abs(resized.astype(np.float32) - expected)
            print(f"\nJPEG {width}x{height} -> {size}: draft {drafted}, page against Pillow: mean |difference| "
                  f"{gap.mean():.2f}, max {gap.max():.0f} (of 255)")
            assert decoded == drafted and gap.mean() < 2, (width, height)
        site.close()


def huge_photo(path):
    """A real photo scaled up to 6000 x 4500 (27 MP), under the decompression-bomb limit."""
    with Image.open(foolbox_data_dir() / "imagenet_00_243.jpg") as photo:
        photo.convert("RGB").resize((6000, 4500), Image.BILINEAR).save(path, quality=80)
    return path


@needs_browser
def test_bad_inputs_get_a_message_and_the_page_keeps_working(int8_site, tmp_path):
    cases = bad_inputs(tmp_path, foolbox_data_dir() / "imagenet_00_243.jpg")
    expected = {"not_image": "not an image file", "zero_bytes": "empty (0 bytes)",
                "truncated_jpeg": "truncated or corrupt", "bomb": "decompression bomb",
                "bomb_warning_level": "decompression bomb"}
    for name, words in expected.items():
        result, message = int8_site.upload(cases[name][0])
        assert result is None and words in message, (name, message)
        assert "not classified" in int8_site.page.inner_text("#status")
    too_big = tmp_path / "too_big.png"
    too_big.write_bytes(b"\x89PNG" + bytes(51 * 2 ** 20))
    result, message = int8_site.upload(too_big)
    assert result is None and "too large (51.0 MB" in message
    result, message = int8_site.upload(huge_photo(tmp_path / "huge.jpg"))
    assert result and result["source"] == "huge.jpg" and "scaled down to 1024 × 768" in message
    int8_site.page.screenshot(path=str(tmp_path / "huge_image.png"), full_page=True)
    result, message = int8_site.upload(cases["bomb"][0])
    int8_site.page.screenshot(path=str(tmp_path / "after_bad_inputs.png"), full_page=True)
    result, message = int8_site.upload(tmp_path / "ok.jpg")  # and a good image still works afterwards
    assert result and result["source"] == "ok.jpg" and not message
    assert not int8_site.outside


@needs_browser
def test_camera(sites, browser, tmp_path):
    """Chromium's fake camera: a moving test pattern, classified frame after frame."""
    with static_server(sites["int8"]) as url:
        site = SitePage(browser, url, permissions=["camera"])
        site.page.click("#camera")
        wait_until(site.page, "window.lastResult && window.lastResult.source === 'camera'")
        first = site.done()
        wait_until(site.page, f"Number(document.body.dataset.done) >= {first + 3}")
        assert site.page.evaluate("document.body.dataset.top1") in site.page.evaluate("window.lastResult.labels")
        site.page.screenshot(path=str(tmp_path / "camera.png"), full_page=True)
        site.page.click("#camera")  # stop
        assert site.page.inner_text("#camera") == "Use the camera"
        site.close()
    assert not site.outside


@pytest.mark.slow
@needs_browser
def test_nothing_leaves_the_machine_over_a_minute(sites, browser, fashion_test, tmp_path):
    """The bundle posts usage logs to a Google endpoint after 60 s and on close(): the page's CSP refuses them.
    The page's clock jumps the minute ahead (its timers fire as they would), so the test need not wait it out."""
    paths = fashion_files(tmp_path, fashion_test)
    with static_server(sites["float32"]) as url:
        site = SitePage(browser, url, fake_clock=True)
        site.page.evaluate("window.refused = []; document.addEventListener('securitypolicyviolation', (e) => "
                           "window.refused.push({url: e.blockedURI, directive: e.effectiveDirective, "
                           "ms: performance.now()}))")
        assert site.upload(paths[0])[0]
        site.page.clock.fast_forward("01:05")
        refused = wait_until(site.page, "window.refused.length && window.refused", timeout=30)
        assert site.upload(paths[1])[0]  # classification keeps working
        site.page.close()  # pagehide: the page closes the classifier, which posts its logs once more
        time.sleep(1)
        site.close()
    assert urlparse(refused[0]["url"]).hostname.endswith("googleapis.com"), refused
    assert refused[0]["directive"] == "connect-src" and refused[0]["ms"] > 55_000, refused
    assert not site.outside, site.outside
    assert all(urlparse(request).hostname == "127.0.0.1" for request in site.requests)


# ---------------------------------------------------------------- export-web's own checks, no browser
def strip_metadata(model_path, out):
    from ai_edge_litert import schema_py_generated as schema
    import flatbuffers

    model = schema.ModelT.InitFromPackedBuf(bytearray(Path(model_path).read_bytes()), 0)
    model.metadata = [entry for entry in model.metadata or [] if entry.name != b"TFLITE_METADATA"]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    out.write_bytes(bytes(builder.Output()))
    return out


def export_web(capsys, *args):
    code = main(["export-web", *map(str, args)])
    return code, capsys.readouterr().err


@needs_runtime
def test_export_web_refuses_bad_models_before_writing(models, tmp_path, capsys):
    from vit_keras.convert.metadata import populate

    text = tmp_path / "notes.tflite"
    text.write_text("not a model\n")
    bare = strip_metadata(models["int8"], tmp_path / "bare.tflite")
    unlabelled = tmp_path / "unlabelled.tflite"
    unlabelled.write_bytes(populate(bare.read_bytes(), {"name": "no labels", "subgraph_metadata": [{}]}, {}))
    sizeless = tmp_path / "sizeless.tflite"  # labelled, RGB, but no input size for the page to resize to
    labels = {"name": "probability", "associated_files": [{"name": "labels.txt", "type": "TENSOR_AXIS_LABELS"}]}
    image = {"name": "image", "content": {"content_properties_type": "ImageProperties",
                                          "content_properties": {"color_space": "RGB"}}}
    sizeless.write_bytes(populate(bare.read_bytes(), {"name": "no size", "subgraph_metadata": [
        {"input_tensor_metadata": [image], "output_tensor_metadata": [labels]}]}, {"labels.txt": b"a\nb\n"}))
    cases = {models["keras"]: "must be a .tflite file", tmp_path / "missing.tflite": "no such model file",
             text: "is not a usable .tflite model", bare: "carries no TFLite metadata",
             unlabelled: "has no labels file", models["attention"]: "takes GRAYSCALE input",
             sizeless: "gives no input image size"}
    for model, words in cases.items():
        out = tmp_path / f"site_{model.stem}"
        code, err = export_web(capsys, model, "--out", out)
        assert code == 2 and words in err, (model, err)
        assert not out.exists()


@needs_runtime
def test_export_web_output_folder(models, tmp_path, capsys):
    out = tmp_path / "site"
    out.mkdir()
    (out / "keep.txt").write_text("a file of the user's\n")
    code, err = export_web(capsys, models["int8"], "--out", out)
    assert code == 2 and "--out" in err and "not empty" in err and "--force" in err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert export_web(capsys, models["int8"], "--out", out, "--force")[0] == 0
    assert (out / "keep.txt").read_text() == "a file of the user's\n"
    assert (out / "model.tflite").read_bytes() == models["int8"].read_bytes()
    index = (out / "index.html").read_text()
    assert 'data-input-width="28" data-input-height="28"' in index  # the model's input, which the page resizes to
    assert "connect-src 'self'" in index and "default-src 'self'" in index
    # The page loads nothing from beyond its folder: no URL with a scheme in what the site's own files name.
    for name in ("index.html", "app.js", "resize.js", "style.css"):
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", (out / name).read_text()), name
    code, err = export_web(capsys, models["int8"], "--out", out / "keep.txt", "--force")
    assert code == 2 and "is not a folder" in err


def test_export_web_without_the_runtime(models, tmp_path, capsys):
    out = tmp_path / "site"
    code, err = export_web(capsys, models["int8"], "--out", out, "--runtime-dir", tmp_path / "nothing")
    assert code == 2 and "scripts/setup.sh" in err and "npm ci" in err and RUNTIME_PACKAGE in err
    assert not out.exists()


def test_runtime_is_pinned_with_its_integrity_hash():
    package = json.loads((REPO / "package.json").read_text())
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert package["dependencies"] == {RUNTIME_PACKAGE: RUNTIME_VERSION}
    entry = lock["packages"][f"node_modules/{RUNTIME_PACKAGE}"]
    assert entry["version"] == RUNTIME_VERSION and entry["integrity"].startswith("sha512-")
    assert "node_modules/" in (REPO / ".gitignore").read_text().split()
    if (default_runtime_dir() / "package.json").is_file():
        assert check_web_runtime() == default_runtime_dir()


@needs_runtime
def test_serve_in_browser(models, tmp_path):
    """`serve --in-browser` exports into a temporary folder, serves it, and removes it when terminated."""
    port, temp = free_port(), tmp_path / "tmp"
    temp.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "vit_keras.apps.cli", "serve", str(models["int8"]),
                                "--in-browser", "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=dict(os.environ, TMPDIR=str(temp)))
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_http(url, process)
        with urllib.request.urlopen(url, timeout=10) as response:
            index = response.read().decode()
        assert "vit_ti16" in index and "connect-src 'self'" in index
        with urllib.request.urlopen(url + "mediapipe/wasm/vision_wasm_internal.wasm", timeout=10) as response:
            assert response.headers["Content-Type"] == "application/wasm"
        with urllib.request.urlopen(url + "model.tflite", timeout=10) as response:
            assert response.read() == models["int8"].read_bytes()
        assert len(list(temp.iterdir())) == 1
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0 and f"in the browser on {url}" in output, output
    assert not list(temp.iterdir())
    code = main(["serve", str(models["int8"]), "--in-browser", "--keras", str(models["keras"])])
    assert code == 2
