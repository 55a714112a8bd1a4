"""Files: atomic writes (a reader, or a rerun after a kill, sees the old file or the new one, never part of one), and
JSON settings files read with a clear error."""

import contextlib
import errno
import json
import os
import shutil
import tempfile

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write ran out of disk space (or quota); the file it was writing was left as it was."""

    def __str__(self):
        return self.strerror  # the message says it all, without "[Errno 28]"


def disk_full(path, error, needed=None):
    """A ``DiskFull`` for ``error`` (an OSError of ``DISK_FULL``) met writing ``path``: where, how much is free
    (and how much the file needs, where ``needed`` bytes is known), and what to do."""
    folder = os.path.dirname(os.path.abspath(path))
    free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
    need = f"; it needs about {size_text(needed)}" if needed else ""
    return DiskFull(error.errno, f"the disk is full: writing {path} failed ({size_text(free)} free in {folder}"
                                 f"{need}), and the file was left as it was. Free some space there, or write to "
                                 "another folder, then run the command again.")


def size_text(count):
    """A byte count in words: kB under a tenth of a MB, else MB."""
    return f"{count / 1e3:.1f} kB" if count < 100_000 else f"{count / 1e6:.1f} MB"


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path, needed=None):
    """A temp path beside ``path``, with its suffixes (writers that pick a format by name, ``.weights.h5`` too,
    still work).

    When the block succeeds the temp file is synced and replaces ``path`` with the usual permissions
    (mkstemp makes it private); on any error it is removed and ``path`` is left as it was. ``needed``: the
    file's size in bytes where the writer knows it, for a full disk's message.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path).lstrip(".")
    suffix = "." + name.split(".", 1)[1] if "." in name else ""
    handle, temp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    os.close(handle)
    try:
        yield temp
        publish(temp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        if isinstance(error, OSError) and error.errno in DISK_FULL and not isinstance(error, DiskFull):
            raise disk_full(path, error, needed) from error
        raise


def publish(temp, path):
    """Sync a finished ``temp`` file, give it the usual permissions and rename it to ``path`` (atomic)."""
    with open(temp, "rb") as written:
        os.fsync(written.fileno())
    os.chmod(temp, 0o666 & ~_umask())
    os.replace(temp, path)


def write_bytes(path, data):
    with atomic_path(path, len(data)) as temp, open(temp, "wb") as f:
        f.write(data)


def write_text(path, text):
    with atomic_path(path, len(text.encode())) as temp, open(temp, "w") as f:
        f.write(text)


def read_json(path):
    """A JSON object file, or None where there is none; a ValueError naming a damaged one."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON file ({error}).") from None
    return data if isinstance(data, dict) else None
