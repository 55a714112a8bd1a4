"""One writer per folder: `train`, `prepare` and `export` hold a lock file that names their process.

    FOLDER/.vit-keras.lock      {"pid", "host", "start" (the process's start time), "command", "since"}

The lock is created whole or not at all (written beside, then hard-linked into place, which fails if it
exists). A second command on the folder meets it: a live process on this machine refuses it with that process's
id; a process that is gone (killed, crashed: its pid no longer runs, or runs another program started later) left
a stale lock, which is taken over and said so; a lock from another machine is refused with what to do, since
whether that process lives can't be told from here. Nothing is deleted without the user's say but a stale lock.
"""

import contextlib
import json
import os
import socket
import tempfile
import time

from vit_keras.files import DISK_FULL, disk_full

LOCK_NAME = ".vit-keras.lock"


class FolderLocked(OSError):
    """Another live process holds the folder."""


def process_start(pid):
    """The start time of process ``pid`` in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def is_alive(holder):
    """Whether the process a lock names still runs (the same process: its start time matches where known)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it runs
    started = process_start(pid)
    return started is None or holder.get("start") in (None, started)


def read_lock(path):
    """The lock's JSON, or None where it is unreadable (which no holder writes: the file appears whole)."""
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def describe(holder):
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"process {holder.get('pid')} ({holder.get('command')}, since {since})"


def create(path, record):
    """Create the lock file ``path`` holding ``record``, whole, unless it exists (FileExistsError)."""
    folder = os.path.dirname(path)
    handle, temp = tempfile.mkstemp(prefix=".tmp-lock-", dir=folder)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.link(temp, path)  # atomic, and refuses an existing name
    except OSError as error:
        if error.errno in DISK_FULL:
            raise disk_full(path, error) from error
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)


@contextlib.contextmanager
def hold(folder, command, lock_name=LOCK_NAME, log=print):
    """Hold ``folder`` (made if missing) for ``command`` while the block runs; ``FolderLocked`` if another live
    process holds it. ``lock_name``: the lock's file name in the folder (an export locks its output file's name)."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise FileExistsError(f"{folder} is a file, not a folder: choose another output folder.")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, lock_name)
    record = dict(pid=os.getpid(), host=socket.gethostname(), start=process_start(os.getpid()), command=command,
                  since=time.time())
    while True:
        try:
            create(path, record)
            break
        except FileExistsError:
            pass
        holder = read_lock(path)
        if holder is not None and holder.get("host") != record["host"]:
            raise FolderLocked(f"{folder} is held by {describe(holder)} on another machine, {holder.get('host')!r}. "
                               f"If no process there writes it any more, delete {path} and run the command again.")
        if holder is not None and is_alive(holder):
            raise FolderLocked(f"{folder} is held by {describe(holder)}, which is still running: wait for it to "
                               f"finish, or write to another folder.")
        stale = f"{path}.stale-{os.getpid()}"
        try:
            os.rename(path, stale)  # one taker wins; the others find the new lock on their next try
        except FileNotFoundError:
            continue
        if read_lock(stale) != holder:  # another taker's fresh lock came between: give it back
            with contextlib.suppress(FileExistsError):
                os.link(stale, path)
            os.remove(stale)
            continue
        os.remove(stale)
        log(f"{folder}: taking over the lock left by {describe(holder or {})}, which is no longer running.")
    try:
        yield path
    finally:
        if (read_lock(path) or {}).get("pid") == record["pid"]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
