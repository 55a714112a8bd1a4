"""`vit-keras serve` driven as a person would: Debian's Chromium via Playwright against a real server."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from app_models import bad_inputs
from vit_keras.apps.cli import main
from vit_keras.apps.examples import bundled_examples, foolbox_data_dir

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
FOOLBOX = foolbox_data_dir()
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium package is not installed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url, process, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "config", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"server at {url} did not answer in {timeout}s")


def answers(url):
    with urllib.request.urlopen(url + "config", timeout=10) as response:
        return response.status == 200


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")))
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "vit_keras.apps.cli", "serve", str(models["attention"]), "--port", str(port)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode in (0, -15), log.read_text()[-3000:]


@pytest.fixture(scope="module")
def page(server):
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server)
        page.wait_for_selector("#upload input[type=file]", state="attached", timeout=60_000)
        yield page
        browser.close()


def wait_for_status(page, name):
    """Wait until the status line reports on file ``name`` (and the progress timer is gone); return it."""
    page.wait_for_function(
        "(name) => { const t = document.querySelector('#status').innerText;"
        " return t.includes(name) && !/^\\s*[0-9.]+s/.test(t); }", arg=name, timeout=30_000)
    return page.inner_text("#status")


def upload(page, path):
    """Upload ``path``; returns (status text, top-1 label or None)."""
    page.set_input_files("#upload input[type=file]", str(path))
    status = wait_for_status(page, Path(path).name)
    top = page.locator("#scores [data-testid=label-output-value]")
    return status, (top.inner_text() if top.count() and "Error" not in status else None)


def cli_top1(capsys, model, path):
    assert main(["classify", str(model), str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["results"][0]["top"][0]["label"]


def test_page_shows_model_and_examples(page):
    info = page.inner_text("#model-info")
    assert "fashion-vit-tiny-attention" in info and "attention output" in info
    page.wait_for_function("document.querySelectorAll('#examples img').length >= 50", timeout=30_000)
    captions = page.locator("#examples .caption-label").all_inner_texts()
    assert sum(c.startswith("Fashion-MNIST") for c in captions) == 10
    assert sum(c.startswith(("CIFAR-10", "ImageNet")) for c in captions) == 40


def test_upload_matches_cli(page, models, fashion_test, tmp_path, capsys):
    images, labels = fashion_test
    path = tmp_path / "fashion_test_42.png"
    Image.fromarray(images[42, :, :, 0], "L").save(path)
    status, top1 = upload(page, path)
    assert top1 == cli_top1(capsys, models["attention"], path)
    assert status.startswith(f"{path.name}: {top1} (") and " ms" in status
    assert page.locator("#shown img").count() == 1  # the attention overlay
    page.screenshot(path=str(tmp_path / "upload.png"), full_page=True)
    assert (tmp_path / "upload.png").stat().st_size > 10_000


def test_example_click_matches_cli(page, models, capsys):
    path, caption = bundled_examples(cache_dir=None)[12]  # a CIFAR-10 photo: RGB into a grayscale model
    page.locator("#examples button.thumbnail-item").nth(12).click()
    wait_for_status(page, Path(path).name)
    top1 = page.inner_text("#scores [data-testid=label-output-value]")
    assert top1 == cli_top1(capsys, models["attention"], path), caption


def test_bad_inputs_answered_and_server_stays_up(page, server, tmp_path):
    cases = bad_inputs(tmp_path, FOOLBOX / "imagenet_00_243.jpg")
    for name, (path, words) in cases.items():
        status, top1 = upload(page, path)
        assert "Error" in status and words in status, (name, status)
        assert answers(server)
    status, top1 = upload(page, tmp_path / "ok.jpg")  # and a good image still works afterwards
    assert top1 and " ms" in status
    page.screenshot(path=str(tmp_path / "after_bad_inputs.png"), full_page=True)


def test_upload_size_limit(page, server, tmp_path):
    """Over 10 MB: the page says so, and the server itself refuses the upload (not only the browser)."""
    big = tmp_path / "big.png"
    big.write_bytes(os.urandom(11 * 1024 * 1024))
    page.set_input_files("#upload input[type=file]", str(big))
    message = page.wait_for_selector("text=/exceed the maximum allowed size/i", timeout=30_000)
    assert "10" in message.inner_text()
    page.screenshot(path=str(tmp_path / "size_limit.png"), full_page=True)
    boundary = "vitkerasboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + big.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(server + "gradio_api/upload", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert answers(server)
