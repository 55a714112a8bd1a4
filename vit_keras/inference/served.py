"""Another interpreter's runtimes, timed in turns with ours: a shared CPU drifts by 10-30% over minutes, so paths
timed one after the other do not compare (docs/benchmarks.md#inference-against-the-peers).

    runtimes = Served([python, "script.py", ...])   # returns once the script has compiled and warmed its paths
    runtimes.info                                   # the JSON object the script printed when ready
    runtimes.seconds("timm eager")                  # the wall time of one batch through that path, there
    runtimes.close()

The script prints one JSON object when ready, then answers each line read from stdin, a path's name, with one
JSON number: the seconds one batch took (``vit_keras/inference/timm_reference.py``, benchmarks/peers_reference.py).
``in_turns`` times such paths and in-process ones round by round.
"""

import json
import subprocess
import tempfile
import time


class Served:
    """A child process serving timings (see the module doc); ``command``: its argv."""

    def __init__(self, command):
        self.log = tempfile.TemporaryFile("w+")  # its stderr: a pipe left unread could fill up and stall it
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True)
        try:
            self.info = self.answer(lambda value: isinstance(value, dict))
        except RuntimeError:
            self.log.close()
            raise

    def answer(self, wanted):
        """The next JSON line of its stdout that ``wanted`` accepts (the runtimes print lines of their own)."""
        for line in self.process.stdout:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if wanted(value):
                return value
        self.log.seek(0)
        lines = self.log.read().strip().splitlines() or ["no output"]
        raise RuntimeError(f"exited with {self.process.wait()}: {lines[-1]}")

    def seconds(self, path):
        self.process.stdin.write(path + "\n")
        self.process.stdin.flush()
        return self.answer(lambda value: isinstance(value, (int, float)))

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
        self.log.close()


def in_turns(paths, rounds, pause=0.0, warm_call=False):
    """{label: [seconds of each round]} of ``paths`` ({label: a function returning the seconds of one call}): each
    round calls every path in turn, so a shared CPU's drift over minutes falls on all of them alike.
    ``warm_call``: a path runs twice a round and its second call counts (the first refills the caches and wakes
    the threads the other runtimes left); ``pause``: seconds for the last runtime's spinning threads to go idle."""
    times = {label: [] for label in paths}
    for _ in range(rounds):
        for label, seconds in paths.items():
            time.sleep(pause)
            if warm_call:
                seconds()
            times[label].append(seconds())
    return times
