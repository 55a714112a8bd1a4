"""vit_keras.framework: the one home of the private internals, and its checks."""

import pytest

from vit_keras import framework


def test_a_moved_internal_is_named():
    with pytest.raises(RuntimeError, match=r"object\._symbolic_build is gone"):
        framework.symbolic_build(object(), data_batch=None)


def test_an_unchecked_version_warns(monkeypatch):
    monkeypatch.setitem(framework.VERIFIED, "keras", "0.0")
    with pytest.warns(UserWarning, match="checked against keras 0.0"):
        framework.check_versions()


def test_the_installed_versions_are_the_checked_ones(recwarn):
    framework.check_versions()
    assert not [w for w in recwarn if "vit_keras.framework" in str(w.message)]


def test_no_other_module_reaches_into_framework_internals():
    """The internals this module wraps appear nowhere else in the package."""
    import pathlib

    import vit_keras

    root = pathlib.Path(vit_keras.__file__).parent
    names = ("._symbolic_build", "._compute_loss", "._loss_tracker", "._flatten_layers", "._get_ops_details",
             "._experimental_calibrate_only", "._maybe_symbolic_build")
    for path in [*root.rglob("*.py"), *(root.parent / "convert").glob("*.py")]:
        if path.name == "framework.py":
            continue
        text = path.read_text()
        assert not [name for name in names if name in text], path
