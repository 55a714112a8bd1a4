"""A real full disk for tests: a small tmpfs mounted in the test's folder, filled up to what is asked to be free."""

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def full_disk(folder, free=16_384, size="2m"):
    """A tmpfs of ``size`` at ``folder`` with a ballast file leaving about ``free`` bytes. Skips the test where this
    process may not mount one (not root, or a container without the right)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield lambda: fill(folder, free)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder, free):
    """Fill ``folder``'s disk with a ballast file until about ``free`` bytes are left."""
    stats = os.statvfs(folder)
    with open(folder / "ballast", "ab") as f:
        f.write(b"\0" * max(stats.f_bavail * stats.f_frsize - free, 0))
