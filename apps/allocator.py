"""Run the `vit-keras` process under tcmalloc, which TensorFlow's CPU runtime needs to be fast.

With glibc's malloc, XLA's per-step buffers go back to the kernel after every step and come back as
fresh, zeroed pages: the quick recipe took ~24,000 page faults per training step and spent a fifth of
its CPU time in the kernel. tcmalloc keeps the memory: 10x fewer page faults and 1.7x the training
throughput on a 2-core machine (Debian package `libtcmalloc-minimal4`, installed by scripts/setup.sh).

A preload must be in place before the process starts, so `vit-keras train | evaluate | bench` re-execute
themselves once with ``LD_PRELOAD`` set, then restore the environment so that their own child processes
start as usual. Set ``VIT_KERAS_TCMALLOC=0`` to opt out. In your own scripts, start Python with
``LD_PRELOAD=libtcmalloc_minimal.so.4``.
"""

import ctypes.util
import os
import sys

_MARK = "_VIT_KERAS_PRELOAD_WAS"  # set only for the re-executed process; holds the caller's LD_PRELOAD


def tcmalloc_loaded():
    """Whether tcmalloc is mapped into this process (preloaded by us or by the user)."""
    try:
        with open("/proc/self/maps") as maps:
            return "tcmalloc" in maps.read()
    except OSError:
        return False


def find_tcmalloc():
    """The tcmalloc shared library's name for LD_PRELOAD, or None when it is not installed."""
    for name in ("tcmalloc_minimal", "tcmalloc"):
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def tcmalloc_environment(environ=None):
    """A copy of ``environ`` (default: this process's) that starts processes under tcmalloc, ahead of any
    library it preloads already, or None where none can be: not Linux, opted out (``VIT_KERAS_TCMALLOC=0``), or not
    installed."""
    environ = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or environ.get("VIT_KERAS_TCMALLOC", "1") == "0":
        return None
    library = find_tcmalloc()
    if library is None:
        return None
    env = dict(environ, LD_PRELOAD=" ".join(filter(None, (library, environ.get("LD_PRELOAD", "")))))
    # tcmalloc reports allocations over 1 GB on stderr; a big dataset in memory is not news
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    return env


def reexec_with_tcmalloc():
    """Start this command again, the same way (console script or ``python -m``), under tcmalloc.

    Returns (without re-executing) where tcmalloc is loaded already or ``tcmalloc_environment`` gives none. In
    the re-executed process it restores the caller's ``LD_PRELOAD``.
    """
    if _MARK in os.environ:
        previous = os.environ.pop(_MARK)
        if previous:
            os.environ["LD_PRELOAD"] = previous
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    env = None if tcmalloc_loaded() else tcmalloc_environment()
    if env is None:
        return
    env[_MARK] = os.environ.get("LD_PRELOAD", "")
    sys.stdout.flush()
    sys.stderr.flush()
    # The same command line, interpreter options (-u, -X, -W) and `-m module` or script included.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
