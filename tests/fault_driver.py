"""Run a `vit-keras` command with a fault at the k-th file it publishes (``vit_keras.files.publish``: every file
the library writes whole goes through it, after its temp file is written and before the rename).

    python tests/fault_driver.py kill|enospc K vit-keras-arguments...

kill: SIGKILL there (a kill mid-write: the temp file written, the file not yet in place); enospc: the write fails
with ENOSPC, as a full disk makes it. K = 0: no fault (counts the files: "published N" on stderr at exit).
"""

import atexit
import errno
import os
import signal
import sys

from vit_keras import files

MODE, AT, ARGV = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
published = []
original = files.publish


def publish(temp, path):
    published.append(path)
    if len(published) == AT:
        if MODE == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, "No space left on device")
    return original(temp, path)


files.publish = publish
atexit.register(lambda: print(f"published {len(published)}: {[os.path.basename(p) for p in published]}",
                              file=sys.stderr))

if __name__ == "__main__":
    from vit_keras.apps.cli import main

    sys.exit(main(ARGV))
