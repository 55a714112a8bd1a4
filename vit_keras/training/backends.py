"""Which Keras backend a run uses, checked before Keras is imported: training's clear errors for a backend that is
unknown or not installed, and for a strategy the backend does not have.

Standard library only: the command line calls it before it imports Keras, whose own error for an unknown backend or
a missing package says neither which values are valid nor how to install one.
"""

import importlib.util
import json
import os
import sys

from vit_keras.constants import BACKEND_STRATEGIES, BACKENDS

# backend -> what to install for it (the versions verified together are in requirements.txt / constraints.txt).
INSTALL = {"tensorflow": "tensorflow-cpu", "jax": "'jax[cpu]'", "torch": "torch"}


def selected_backend():
    """The backend of this process: Keras's own once it is imported, else what Keras will pick (the KERAS_BACKEND
    variable, then the "backend" of keras.json, then TensorFlow)."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        return keras.backend.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return json.load(f).get("backend") or "tensorflow"
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def check_backend(backend=None):
    """``backend`` (default: ``selected_backend()``) if vit-keras trains on it and its package is installed."""
    backend = backend or selected_backend()
    if backend not in BACKENDS:
        raise ValueError(f"KERAS_BACKEND={backend!r} is not a backend vit-keras trains on; valid values are "
                         f"{', '.join(map(repr, BACKENDS))}.")
    if importlib.util.find_spec(backend) is None:
        raise ValueError(f"KERAS_BACKEND={backend!r} needs the {backend} package, which is not installed: "
                         f"pip install {INSTALL[backend]} (or the set-up's pip install -r requirements.txt "
                         "-c constraints.txt).")
    return backend


def check_strategy(strategy, backend=None, name="`strategy`"):
    """``strategy`` if ``backend`` has it; else an error naming ``name`` (the keyword or the CLI flag) and the
    backend's valid choices."""
    backend = check_backend(backend)
    valid = BACKEND_STRATEGIES[backend]
    if strategy not in valid:
        raise ValueError(f"Unknown {name}={strategy!r}; valid values are {', '.join(map(repr, valid))} under the "
                         f"{backend} backend (KERAS_BACKEND={backend}).")
    return strategy
