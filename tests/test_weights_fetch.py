"""Downloads an organization can run: presets fetched through a mirror (a real HTTP server on 127.0.0.1 or a
folder), cached, resumed after a cut, and every failure named: the preset, the URL, where to put the file.

No test reaches the network: the mirror stands in for the public hosts, keeping their URL paths.
"""

import hashlib
import os
import shutil
import socket
import urllib.parse

import pytest

from vit_keras.weights import fetch as weights_fetch
from vit_keras.weights.fetch import PART_SUFFIX, DownloadError, cache_path, resolve
from vit_keras.weights.presets import get_preset
from weight_server import WeightServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "weights", "google_augreg.npz")
PRESET = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
URL_PATH = urllib.parse.urlparse(get_preset(PRESET).url).path  # /vit_models/augreg/Ti_16-...npz


def place(folder, url_path=URL_PATH, source=FIXTURE):
    """Copy ``source`` into ``folder`` under the URL's path, as a mirror holds it."""
    target = os.path.join(folder, *url_path.lstrip("/").split("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy(source, target)
    return target


def fixture_bytes():
    with open(FIXTURE, "rb") as f:
        return f.read()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_KERAS_CACHE", str(tmp_path / "cache"))
    for name in ("no_proxy", "NO_PROXY"):  # a CI proxy must not swallow requests to 127.0.0.1
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    return tmp_path / "cache"


@pytest.fixture
def mirror(tmp_path, cache, monkeypatch):
    """A real HTTP server serving tmp_path/hosted as the mirror of the public hosts."""
    server = WeightServer(str(tmp_path / "hosted"))
    monkeypatch.setenv(weights_fetch.MIRROR_ENV, server.url + "/")
    yield server
    server.close()


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(root, f), folder) for root, _, names in os.walk(folder) for f in names)


def test_a_preset_downloads_through_the_mirror_once_then_comes_from_the_cache(mirror, tmp_path, cache):
    place(str(tmp_path / "hosted"))
    path = resolve(PRESET)
    assert path == cache_path(get_preset(PRESET).url)  # cached under the public URL, not the mirror's
    assert open(path, "rb").read() == fixture_bytes()
    assert mirror.requests == [(URL_PATH, None)]
    assert resolve(PRESET) == path and len(mirror.requests) == 1  # from the cache: no request
    assert resolve("vit_tiny_patch16_224.augreg_in21k_ft_in1k") == path
    assert files_under(str(cache)) == [os.path.relpath(path, cache)]  # nothing else: no .part, no temp file


def test_a_connection_cut_mid_file_is_resumed_with_a_range_request(mirror, tmp_path, cache):
    place(str(tmp_path / "hosted"))
    data, target = fixture_bytes(), cache_path(get_preset(PRESET).url)
    mirror.cut[URL_PATH] = len(data) // 3
    with pytest.raises(DownloadError) as info:
        resolve(PRESET)
    message = str(info.value)
    for part in (f"preset {PRESET!r}", mirror.url + URL_PATH, target, "resumes", "curl -L"):
        assert part in message, part
    assert not os.path.exists(target)  # nothing half-written under the file's name
    assert os.path.getsize(target + PART_SUFFIX) == len(data) // 3
    assert resolve(PRESET) == target
    assert open(target, "rb").read() == data and not os.path.exists(target + PART_SUFFIX)
    assert mirror.requests[-1] == (URL_PATH, f"bytes={len(data) // 3}-")  # only the rest was asked for


def test_a_server_that_ignores_range_sends_the_whole_file_again(tmp_path, cache, monkeypatch):
    server = WeightServer(str(tmp_path / "hosted"), ranges=False)
    monkeypatch.setenv(weights_fetch.MIRROR_ENV, server.url)
    try:
        place(str(tmp_path / "hosted"))
        server.cut[URL_PATH] = 1000
        with pytest.raises(DownloadError, match="cut after 1,000 of"):
            resolve(PRESET)
        assert open(resolve(PRESET), "rb").read() == fixture_bytes()
    finally:
        server.close()


def test_404_names_the_preset_the_url_and_where_to_put_the_file(mirror, cache):
    with pytest.raises(DownloadError) as info:
        resolve(PRESET)
    message, target = str(info.value), cache_path(get_preset(PRESET).url)
    for part in ("HTTP 404", f"preset {PRESET!r}", mirror.url + URL_PATH, get_preset(PRESET).url, target):
        assert part in message, part
    assert not os.path.exists(str(cache)) or files_under(str(cache)) == []  # no empty .part left behind


def test_a_wrong_checksum_caches_nothing(mirror, tmp_path, cache):
    place(str(tmp_path / "hosted"))
    with pytest.raises(ValueError, match="expected 0{64}") as info:
        resolve(PRESET, sha256="0" * 64)
    assert f"preset {PRESET!r}" in str(info.value) and cache_path(get_preset(PRESET).url) in str(info.value)
    assert files_under(str(cache)) == []
    right = hashlib.sha256(fixture_bytes()).hexdigest()
    assert open(resolve(PRESET, sha256=right), "rb").read() == fixture_bytes()


def test_offline_without_a_cache_says_how_to_fetch_the_file_and_where_to_put_it(cache, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: refused, as offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(weights_fetch.MIRROR_ENV, f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError) as info:
        resolve(PRESET)
    message, target = str(info.value), cache_path(get_preset(PRESET).url)
    for part in ("offline", f"preset {PRESET!r}", get_preset(PRESET).url, target, "curl -L -o"):
        assert part in message, part
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy(FIXTURE, target)  # where the message says: now it needs no network
    assert resolve(PRESET) == target


def test_a_folder_mirror_is_read_in_place_and_names_the_missing_file(tmp_path, cache, monkeypatch):
    monkeypatch.setenv(weights_fetch.MIRROR_ENV, f"file://{tmp_path / 'mirror'}")
    with pytest.raises(DownloadError) as info:
        resolve(PRESET)
    expected = os.path.join(str(tmp_path / "mirror"), *URL_PATH.lstrip("/").split("/"))
    assert expected in str(info.value) and f"preset {PRESET!r}" in str(info.value)
    placed = place(str(tmp_path / "mirror"))
    assert resolve(PRESET) == placed and not os.path.exists(str(cache))  # not copied


def test_mirror_locations_keep_the_url_path():
    url = "https://huggingface.co/google/vit-base-patch16-224/resolve/main/model.safetensors"
    assert weights_fetch.mirror_location(url, "https://m.example/vit/") == \
        "https://m.example/vit/google/vit-base-patch16-224/resolve/main/model.safetensors"
    assert weights_fetch.mirror_location(url, "/srv/w") == \
        "/srv/w/google/vit-base-patch16-224/resolve/main/model.safetensors"
    assert weights_fetch.mirror_location(url, "") is None


def test_a_typo_names_the_nearest_presets(cache):
    with pytest.raises(FileNotFoundError, match="nearest are vit_tiny_patch16_224.augreg_in21k_ft_in1k"):
        resolve("vit_tiny_patch16_224.augreg_in21k_ft_in")
