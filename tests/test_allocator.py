"""The CLI runs under tcmalloc (apps/allocator.py) and does not pass the preload on to its children."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vit_keras.apps.allocator import find_tcmalloc, tcmalloc_environment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux-only")

PROBE = """
import json, os, subprocess, sys
from vit_keras.apps.allocator import reexec_with_tcmalloc, tcmalloc_loaded
reexec_with_tcmalloc()
child = subprocess.run([sys.executable, "-c", "from vit_keras.apps.allocator import tcmalloc_loaded as t; print(t())"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps(dict(loaded=tcmalloc_loaded(), preload=os.environ.get("LD_PRELOAD"), child=child,
                      args=sys.argv[1:])))
"""


def run_probe(tmp_path, **env):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VIT_KERAS_TCMALLOC")}
    result = subprocess.run([sys.executable, str(script), "--flag", "a b"], capture_output=True, text=True,
                            env={**clean, **env}, cwd=Path(__file__).parents[1], timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tcmalloc_is_installed_by_setup():
    assert find_tcmalloc() is not None, "scripts/setup.sh installs the Debian package libtcmalloc-minimal4"


def test_reexec_runs_under_tcmalloc_with_the_same_arguments_and_a_clean_environment(tmp_path):
    probe = run_probe(tmp_path)
    assert probe["loaded"] is True
    assert probe["args"] == ["--flag", "a b"]
    assert probe["preload"] is None and probe["child"] == "False"  # children start as usual


def test_opt_out(tmp_path):
    assert run_probe(tmp_path, VIT_KERAS_TCMALLOC="0")["loaded"] is False


def test_the_environment_preloads_tcmalloc_ahead_of_the_callers_library():
    env = tcmalloc_environment({"LD_PRELOAD": "libcallers.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{find_tcmalloc()} libcallers.so" and env["PATH"] == "/bin"
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40  # no report for a big dataset in memory
    assert tcmalloc_environment({"VIT_KERAS_TCMALLOC": "0"}) is None
