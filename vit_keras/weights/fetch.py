"""Where a checkpoint comes from: a local path, or an http(s) URL cached on disk.

Downloads go to ``cache_dir`` (argument) > ``$VIT_KERAS_CACHE`` > ``~/.cache/vit_keras``,
under ``<host>/<url path>`` so two URLs ending in the same file name (every Hugging Face
``model.safetensors``) never collide. A download is written to a temporary file in the
same folder, checked (length, optional sha256) and only then renamed into place, so the
cache never holds a partial file. A sha256 can be passed as an argument or appended to
the URL as ``#sha256=<hex>`` (pip's convention), which ``create_model(weights=...)`` allows.
"""

import contextlib
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from vit_keras.files import atomic_path

CACHE_ENV = "VIT_KERAS_CACHE"
FOLDER_WEIGHTS = "model.safetensors"  # the weights file of a Hugging Face or timm folder
CHUNK = 1 << 20


class DownloadError(FileNotFoundError):
    """The checkpoint is not on disk and could not be downloaded."""


def cache_root(cache_dir=None):
    return os.path.expanduser(cache_dir or os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "vit_keras"))


def is_url(weights):
    return isinstance(weights, str) and re.match(r"^(https?|gs)://", weights) is not None


def split_url(url, sha256=None):
    """(download URL, expected sha256 or None); gs://bucket/x is Google Cloud Storage's public https."""
    url, _, fragment = url.partition("#")
    match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", fragment)
    if fragment and not match:
        raise ValueError(f"`weights` URL fragment must be '#sha256=<64 hex digits>'; got '#{fragment}'.")
    if match and sha256 and match.group(1).lower() != sha256.lower():
        raise ValueError("`sha256` and the URL's '#sha256=' fragment disagree.")
    if url.startswith("gs://"):
        url = "https://storage.googleapis.com/" + url[len("gs://"):]
    return url, normalize_sha256(sha256 or (match.group(1) if match else None))


def normalize_sha256(sha256):
    if sha256 is None:
        return None
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise ValueError(f"`sha256` must be 64 hex digits; got {sha256!r}.")
    return sha256.lower()


def cache_path(url, cache_dir=None):
    """The file a URL is cached at: <cache>/<host>/<path parts>, with unsafe characters replaced."""
    parsed = urllib.parse.urlparse(url)
    host = (parsed.hostname or "") + (f"_{parsed.port}" if parsed.port else "")  # never the user:password@
    parts = [host] + [p for p in urllib.parse.unquote(parsed.path).split("/") if p]
    if parsed.query:  # signed or versioned URLs: keep them apart without leaking the query into the name
        parts[-1] += "-" + hashlib.sha256(parsed.query.encode()).hexdigest()[:10]
    safe = [re.sub(r"[^A-Za-z0-9._+=@-]", "_", p).lstrip(".") or "_" for p in parts]
    if len(safe) == 1:
        safe.append("checkpoint")
    return os.path.join(cache_root(cache_dir), *safe)


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(weights, cache_dir=None, sha256=None, timeout=60):
    """A local file path for ``weights`` (a path, a folder holding model.safetensors, or a URL), downloading and
    verifying as needed."""
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(f"`weights` must be a file path or an http(s) URL; got {type(weights).__name__}.")
    if not is_url(weights):
        path = os.fspath(weights)
        if os.path.isdir(path):  # a Hugging Face or timm folder
            path = os.path.join(path, FOLDER_WEIGHTS)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"`weights` folder {os.fspath(weights)!r} holds no {FOLDER_WEIGHTS}.")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Weights file not found: {path}")
        if sha256:
            check_sha256(path, normalize_sha256(sha256), downloaded=False)
        return path
    url, expected = split_url(weights, sha256)
    path = cache_path(url, cache_dir)
    if os.path.isfile(path):
        if expected:
            check_sha256(path, expected, downloaded=False)
        return path
    download(url, path, expected, timeout)
    return path


def check_sha256(path, expected, downloaded):
    actual = file_sha256(path)
    if actual != expected:
        what = "Downloaded file" if downloaded else "File"
        hint = "The download is corrupt or the file changed upstream." if downloaded else \
            "Delete it to download again, or fix the expected checksum."
        raise ValueError(f"{what} {path} has sha256 {actual}, expected {expected}. {hint}")


def shown(url):
    """``url`` without its user:password@, for messages."""
    parsed = urllib.parse.urlparse(url)
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def download(url, path, expected_sha256=None, timeout=60):
    """Fetch ``url`` into ``path`` atomically: temp file, length and sha256 checks, then rename.

    Network failures are a DownloadError; a local write failure (disk full, no permission) stays an OSError
    that names the cache file.
    """
    with atomic_path(path) as temp:
        digest, received = hashlib.sha256(), 0
        with _network_errors(url, path):
            response = urllib.request.urlopen(url, timeout=timeout)
        with response, open(temp, "wb") as out:
            announced = response.headers.get("Content-Length")
            while True:
                with _network_errors(url, path):
                    chunk = response.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
        if announced is not None and received != int(announced):
            raise ValueError(f"Download of {shown(url)} is truncated: got {received} of {announced} bytes; try again.")
        if expected_sha256 and digest.hexdigest() != expected_sha256:
            raise ValueError(
                f"Downloaded file from {shown(url)} has sha256 {digest.hexdigest()}, expected {expected_sha256}. "
                "The download is corrupt or the file changed upstream; nothing was cached."
            )


@contextlib.contextmanager
def _network_errors(url, path):
    try:
        yield
    except http.client.IncompleteRead as error:
        raise ValueError(f"Download of {shown(url)} is truncated ({error}); nothing was cached. Try again.") from error
    except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
        if isinstance(error, urllib.error.HTTPError):
            reason = f"HTTP {error.code} {error.reason}"
        else:
            reason = str(getattr(error, "reason", error))
        raise DownloadError(
            f"Could not download {shown(url)} ({reason}). If this machine is offline, download the file "
            f"elsewhere and put it at {path} (or pass its local path as `weights`)."
        ) from error
