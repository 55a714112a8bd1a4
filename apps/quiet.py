"""Hide the runtimes' own log output (TensorFlow, LiteRT, absl, the converter) so a command shows its own lines.

Where the lines come from (TF 2.21, ai-edge-litert 2.3), and so what hides each:
  - native code writing to file descriptor 2: absl's "All log messages before absl::InitializeLog()" and
    TensorFlow's oneDNN notice (both at library load, before TF_CPP_MIN_LOG_LEVEL or GLOG_minloglevel is read:
    neither variable hides them), the calibrator's "fully_quantize: ..." line, TFLite's "INFO: Created ... XNNPACK
    delegate" and LiteRT's accelerator and compiler-plugin lines (loggers that read no variable): only pointing
    descriptor 2 elsewhere hides these;
  - Python logging (absl's "Please consider providing the trackable_obj argument"): a handler filter;
  - Python warnings from the runtimes' own modules (the converter's "Statistics for quantized inputs ..."):
    a warnings filter.
Python's sys.stderr is moved to a copy of the real descriptor 2 first, so the command's own messages, tracebacks
and warnings from any other module still show as they happen.

These are process-wide settings, so the CLI applies them only when it is the process (not when a caller passes
argv), and `--verbose` skips them. Standard library only: it runs before TensorFlow or LiteRT is imported.
"""

import contextlib
import faulthandler
import logging
import os
import re
import sys
import tempfile
import warnings

# Top-level logger and module names of the runtimes whose notices are hidden (errors from them still show).
RUNTIME_PACKAGES = ("absl", "tensorflow", "tensorflow_datasets", "tf_keras", "keras", "jax", "h5py",
                    "ai_edge_litert", "mediapipe", "google")


class RuntimeRecordFilter(logging.Filter):
    """Drops the runtimes' log records below ERROR; keeps every other logger's records."""

    def filter(self, record):
        return record.levelno >= logging.ERROR or record.name.split(".")[0] not in RUNTIME_PACKAGES


def hide_python_runtime_logs():
    """Filter the runtimes' Python log records and warnings. A root handler is installed (logging's default
    format) so absl and TensorFlow use it instead of adding their own unfiltered ones."""
    if not logging.root.handlers:
        logging.basicConfig()
    for handler in logging.root.handlers:
        handler.addFilter(RuntimeRecordFilter())
    warnings.filterwarnings("ignore", module=rf"({'|'.join(RUNTIME_PACKAGES)})(\.|$)")


def capture_native_stderr():
    """Point descriptor 2 at a temporary file, and sys.stderr at a copy of the real descriptor 2.

    Returns the file (to replay on an error), or None where no temporary file can be made (then nothing moves).
    Descriptor 2 stays on the file until the process exits: LiteRT also logs from its destructors at exit.
    """
    try:
        captured = tempfile.TemporaryFile()
    except OSError:
        return None
    sys.stderr.flush()
    real_stderr = os.dup(2)
    os.dup2(captured.fileno(), 2)
    sys.stderr = open(real_stderr, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    faulthandler.enable(file=sys.stderr)  # a crash inside a runtime still shows where, though its log is captured
    return captured


# The start of a native log message: glog/absl ("I0000 00:00:...", severity letter first) or TFLite/LiteRT
# ("INFO: ..."). Lines without one continue the message before them (a path, a list of CPU instructions).
NATIVE_MESSAGE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:|(VERBOSE|DEBUG|INFO|WARNING|ERROR|FATAL): ")
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def failure_lines(text):
    """The captured native output worth showing with an error: every message but INFO-level ones and absl's
    notice about its own set-up."""
    kept, keep = [], True
    for line in text.splitlines(keepends=True):
        start = NATIVE_MESSAGE.match(line)
        if start:
            severity = start.group(1) or start.group(2)[0]
            keep = severity not in "VDI" and not line.startswith(ABSL_PREAMBLE)
        if keep:
            kept.append(line)
    return "".join(kept)


def replay(captured):
    """Write what the runtimes wrote to descriptor 2 so far, less the INFO-level messages, to the real stderr."""
    captured.seek(0)
    text = failure_lines(captured.read().decode(errors="backslashreplace"))
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


@contextlib.contextmanager
def runtime_logs_hidden():
    """Hide the runtimes' log output from here to the end of the process. If the block raises, the runtimes'
    captured native warnings and errors are written to stderr first, so what they said about the failure shows."""
    captured = capture_native_stderr()
    hide_python_runtime_logs()
    try:
        yield
    except Exception:
        if captured is not None:
            replay(captured)
        raise
