"""The `vit-keras` command line's own help: every argument explained with its default, the defaults the help states
equal to the library's, and `vit-keras --version`."""

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import vit_keras
from vit_keras.apps.cli import COMMANDS, build_parser, main
from vit_keras.constants import RECIPES

REPO = Path(__file__).resolve().parents[1]


def parsers():
    """(name, parser) of the top level and of every subcommand."""
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert set(commands.choices) == set(COMMANDS)
    return [("vit-keras", parser), *commands.choices.items()]


def expanded_help(parser, action):
    """The help as `--help` prints it: %(default)s and the like filled in."""
    return parser._get_formatter()._expand_help(action)


def default_words(default):
    """What the help must name of a default: its value, or each item of a list."""
    if isinstance(default, (list, tuple)):
        return [str(item) for item in default]
    return [str(default)]


@pytest.mark.parametrize("name, parser", parsers(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_argument_has_help_that_states_its_default(name, parser):
    missing, silent = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS or not expanded_help(parser, action).strip():
            missing.append(flag)
            continue
        takes_value = action.nargs != 0  # flags (store_true, store_const) have no value of their own to state
        if not takes_value or action.default in (None, False, argparse.SUPPRESS) or action.required:
            continue
        text = expanded_help(parser, action).lower()
        if "default" not in text or not all(word.lower() in text for word in default_words(action.default)):
            silent.append(f"{flag} (default {action.default!r}): {expanded_help(parser, action)!r}")
    assert not missing, f"{name}: arguments without help: {missing}"
    assert not silent, f"{name}: help that does not state the default:\n" + "\n".join(silent)


def test_train_states_the_recipes_values():
    """The help reads the recipes' one table (vit_keras.constants, which the library's TrainConfig fills from): --epochs,
    say, states every recipe's value."""
    from vit_keras.constants import BASE_BATCH_SIZE
    from vit_keras.training.config import RECIPES as LIBRARY_RECIPES

    parser = dict(parsers())["train"]
    helps = {action.dest: expanded_help(parser, action) for action in parser._actions}
    epochs = ", ".join(f"{LIBRARY_RECIPES[recipe]['epochs']} {recipe}" for recipe in RECIPES)
    assert f"(default: the recipe's: {epochs};" in helps["epochs"]  # "20 quick, 90 long, 3 finetune"
    assert "on CPUs a fine-tune with no --image-size takes fewer, down to 1" in helps["epochs"]
    for setting in ("batch_size", "optimizer", "weight_decay", "label_smoothing", "drop_path", "patch_dropout",
                    "warmup_epochs", "augment", "crop_scale", "mixup", "cutmix", "erase", "teacher_steps"):
        assert "the recipe's: " in helps[setting], setting
    quick = LIBRARY_RECIPES["quick"]
    assert f"{quick['base_lr'] * quick['batch_size'] / BASE_BATCH_SIZE:g} quick" in helps["lr"]


def test_threads_is_a_list_in_verify_and_one_number_in_classify():
    helps = {name: {action.dest: expanded_help(parser, action) for action in parser._actions}
             for name, parser in parsers()}
    assert helps["verify"]["threads"].startswith("a list") and "comma-separated" in helps["verify"]["threads"]
    for name in ("classify", "serve"):
        assert helps[name]["threads"].startswith("one number"), name
    assert "a .tflite model only" in helps["classify"]["threads"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"vit-keras {vit_keras.__version__}\n"
    with open(REPO / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["version"] == vit_keras.__version__
    result = subprocess.run([sys.executable, "-m", "vit_keras.apps.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout == f"vit-keras {vit_keras.__version__}\n", result.stderr


def test_the_license_is_the_apache_license_pyproject_names():
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    with open(REPO / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["license"] == "Apache-2.0"
