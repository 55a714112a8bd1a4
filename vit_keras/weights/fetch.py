"""Where a checkpoint comes from: a local path, a preset name (``vit_keras.weights.presets``) or an http(s) URL
cached on disk.

Downloads go to ``cache_dir`` (argument) > ``$VIT_KERAS_CACHE`` > ``~/.cache/vit_keras``, under
``<host>/<url path>`` so two URLs ending in the same file name (every Hugging Face ``model.safetensors``) never
collide. A download streams into ``<file>.part`` beside its place in the cache and is renamed into place only
once complete and checked (length, sha256 where one is known), so the cache never holds a partial file under
its name. A connection cut mid-file leaves the ``.part``; the next call resumes it with an HTTP Range request
(a server that ignores Range sends the whole file again). A sha256 can be passed as an argument or appended to
the URL as ``#sha256=<hex>`` (pip's convention), which ``create_model(weights=...)`` allows.

``$VIT_KERAS_WEIGHTS_MIRROR`` stands in for the public hosts: a base URL (``https://mirror.example/vit``) or a
folder (``/srv/vit`` or ``file:///srv/vit``). The URL's path is kept: ``https://storage.googleapis.com/
vit_models/augreg/X.npz`` is fetched from ``<mirror>/vit_models/augreg/X.npz``. A folder mirror's files are read
where they are; nothing falls back to the public host.
"""

import contextlib
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request

from vit_keras.constants import GCS_HTTPS
from vit_keras.files import publish
from vit_keras.weights.presets import find_preset, nearest_presets

try:
    import fcntl
except ImportError:  # not POSIX: concurrent downloads of one file are not serialized
    fcntl = None

CACHE_ENV = "VIT_KERAS_CACHE"
MIRROR_ENV = "VIT_KERAS_WEIGHTS_MIRROR"
FOLDER_WEIGHTS = "model.safetensors"  # the weights file of a Hugging Face or timm folder
PART_SUFFIX = ".part"
CHUNK = 1 << 20


class DownloadError(FileNotFoundError):
    """The checkpoint is not on disk and could not be downloaded (or was cut off: a rerun resumes it)."""


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
        url = GCS_HTTPS + url[len("gs://"):]
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


def mirror_location(url, mirror=None):
    """Where ``$VIT_KERAS_WEIGHTS_MIRROR`` (or ``mirror``) keeps ``url``: a URL, a local path, or None (no mirror)."""
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return None
    path = urllib.parse.urlparse(url).path
    if re.match(r"^https?://", mirror):
        return mirror.rstrip("/") + path
    folder = urllib.parse.unquote(urllib.parse.urlparse(mirror).path) if mirror.startswith("file://") else mirror
    return os.path.join(os.path.expanduser(folder), *[p for p in urllib.parse.unquote(path).split("/") if p])


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(weights, cache_dir=None, sha256=None, timeout=60):
    """A local file path for ``weights`` (a path, a folder holding model.safetensors, a preset name or a URL),
    downloading and verifying as needed."""
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(f"`weights` must be a file path, a preset name or an http(s) URL; got "
                         f"{type(weights).__name__}.")
    preset = find_preset(weights)
    if preset is None and not is_url(weights):
        return local_file(os.fspath(weights), sha256)
    what = f"preset {preset.name!r}" if preset else "`weights`"
    url, expected = split_url(preset.url if preset else weights, sha256 or (preset and preset.sha256))
    path = cache_path(url, cache_dir)
    if os.path.isfile(path):
        if expected:
            check_sha256(path, expected, downloaded=False)
        return path
    mirror = mirror_location(url)
    if mirror is not None and not is_url(mirror):
        return mirrored_file(mirror, url, path, expected, what)
    download(url, path, expected, timeout, what=what, source=mirror)
    return path


def local_file(path, sha256=None):
    """A checkpoint file on disk (a folder: its model.safetensors, or a keras-hub preset's model.weights.h5),
    checked against ``sha256`` if given."""
    if os.path.isdir(path):  # a Hugging Face or timm folder, or a keras-hub preset
        from vit_keras.weights.keras_hub import BACKBONE_WEIGHTS, is_keras_hub_folder

        folder, path = path, os.path.join(path, FOLDER_WEIGHTS)
        if not os.path.isfile(path) and is_keras_hub_folder(folder):
            path = os.path.join(folder, BACKBONE_WEIGHTS)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"`weights` folder {folder!r} holds no {FOLDER_WEIGHTS} (a Hugging Face or timm "
                                    f"folder) nor a keras-hub preset ({BACKBONE_WEIGHTS} with its config.json).")
    if not os.path.isfile(path):
        near = nearest_presets(os.path.basename(path))
        hint = f" It is no preset either; the nearest are {', '.join(near)}." if near and os.sep not in path else ""
        raise FileNotFoundError(f"Weights file not found: {path}.{hint}")
    if sha256:
        check_sha256(path, normalize_sha256(sha256), downloaded=False)
    return path


def mirrored_file(mirror, url, path, expected, what):
    """The file a folder mirror holds for ``url``, checked; a DownloadError saying where it belongs if absent."""
    if not os.path.isfile(mirror):
        raise DownloadError(f"The weights mirror ({MIRROR_ENV}) has no file for {what}: expected {mirror}, the path "
                            f"of {shown(url)} under the mirror. {by_hand(url, path, mirror)}")
    if expected:
        check_sha256(mirror, expected, downloaded=False)
    return mirror


def by_hand(url, path, mirror=None):
    """How to fetch a file by hand, and where to put it."""
    where = f"{path}" + (f" (or {mirror}, in the mirror)" if mirror else "")
    return (f"To fetch it by hand (e.g. offline): `curl -L -o {os.path.basename(path)} '{shown(url)}'` on a machine "
            f"with network access, then put the file at {where}; or pass its local path as `weights`, or set "
            f"{MIRROR_ENV} to a mirror of the public hosts.")


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


@contextlib.contextmanager
def part_file(path):
    """The open ``path``.part (bytes kept from a cut download, appended to), locked against a concurrent
    download of the same file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + PART_SUFFIX, "ab") as part:
        if fcntl is not None:
            fcntl.flock(part.fileno(), fcntl.LOCK_EX)  # released when the file closes
        try:
            yield part
        except BaseException:
            if not os.fstat(part.fileno()).st_size:  # nothing received: no part to resume
                os.remove(part.name)
            raise


def download(url, path, expected_sha256=None, timeout=60, what="`weights`", source=None):
    """Fetch ``url`` (from ``source``, a mirror URL, where given) into ``path``, resuming a ``.part`` a cut
    download left; the part is renamed to ``path`` only once its length and sha256 check.

    A network failure or a cut is a DownloadError (a rerun resumes a cut); a wrong sha256 is a ValueError and
    discards the part; a local write failure (disk full, no permission) stays an OSError naming the file.
    """
    source = source or url
    with part_file(path) as part:
        if os.path.isfile(path):  # another process finished it while this one waited for the lock
            return path
        total = fetch_into(part, source, path, timeout, what, url)
        part.flush()
        size = os.fstat(part.fileno()).st_size
    if total is not None and size != total:
        raise DownloadError(f"The download of {what} from {shown(source)} was cut after {size:,} of {total:,} bytes "
                            f"(truncated); they are kept in {path}{PART_SUFFIX} and the next try resumes from there. "
                            f"{by_hand(url, path)}")
    actual = file_sha256(path + PART_SUFFIX) if expected_sha256 else None
    if actual != expected_sha256:
        os.remove(path + PART_SUFFIX)
        raise ValueError(f"Downloaded file for {what} from {shown(source)} has sha256 {actual}, expected "
                         f"{expected_sha256}: it is corrupt or changed upstream; nothing was cached. "
                         f"{by_hand(url, path)}")
    publish(path + PART_SUFFIX, path)
    return path


def fetch_into(part, source, path, timeout, what, url):
    """Append ``source``'s bytes to the open ``part`` from where it ends (or restart when the server sends the
    whole file); returns the file's announced full length, or None."""
    offset = part.seek(0, os.SEEK_END)
    request = urllib.request.Request(source, headers={"Range": f"bytes={offset}-"} if offset else {})
    with _network_errors(source, path, what, url):
        try:
            response = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            if error.code != 416 or not offset:  # 416: the kept part is no prefix of the file: start again
                raise
            part.truncate(0)
            offset, response = 0, urllib.request.urlopen(source, timeout=timeout)
    with response:
        start = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", "")) if response.status == 206 else None
        if offset and (start is None or int(start.group(1)) != offset):  # Range ignored: the whole file again
            if start is not None:  # another range than asked for: start afresh next time
                part.truncate(0)
                raise DownloadError(f"{shown(source)} answered a resumed download of {what} with another byte range; "
                                    f"the kept part was dropped: try again. {by_hand(url, path)}")
            part.truncate(0)
            offset = 0
        total = announced_length(response, offset)
        while True:
            with _network_errors(source, path, what, url):
                chunk = response.read(CHUNK)
            if not chunk:
                return total
            part.write(chunk)


def announced_length(response, offset):
    """The full file length a response announces (Content-Range of a 206, else Content-Length), or None."""
    match = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", "").strip())
    if response.status == 206 and match:
        return int(match.group(1))
    length = response.headers.get("Content-Length")
    return None if length is None else int(length) + (offset if response.status == 206 else 0)


@contextlib.contextmanager
def _network_errors(source, path, what, url):
    try:
        yield
    except http.client.IncompleteRead as error:
        raise DownloadError(f"The download of {what} from {shown(source)} was cut ({error}; truncated); the bytes "
                            f"received are kept in {path}{PART_SUFFIX} and the next try resumes from there. "
                            f"{by_hand(url, path)}") from error
    except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
        if isinstance(error, urllib.error.HTTPError):
            reason = f"HTTP {error.code} {error.reason}"
        else:
            reason = str(getattr(error, "reason", error))
        raise DownloadError(f"Could not download {what} from {shown(source)} ({reason}). {by_hand(url, path)}") \
            from error
