"""The `vit-keras` command line: one front door that dispatches to a subcommand module."""

import argparse
import contextlib
import importlib
import sys

from vit_keras import __version__

from .allocator import reexec_with_tcmalloc
from .quiet import runtime_logs_hidden

# subcommand -> module under apps.commands
COMMANDS = {
    "train": "train",
    "prepare": "prepare",
    "evaluate": "evaluate",
    "export": "export",
    "export-web": "export_web",
    "verify": "verify",
    "classify": "classify",
    "serve": "serve",
    "explain": "explain",
    "inspect": "inspect_model",
    "bench": "bench",
    "presets": "presets",
}

# The commands whose work is TensorFlow compute, which tcmalloc speeds up (apps/allocator.py). The others run
# LiteRT or nothing heavy; `serve` tunes glibc's malloc for a long-lived process.
TCMALLOC_COMMANDS = ("train", "evaluate", "bench")


def build_parser():
    # --verbose goes before or after the command; SUPPRESS keeps a subcommand's default from overwriting the other
    verbosity = argparse.ArgumentParser(add_help=False)
    verbosity.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                           help="also show the runtimes' own log lines (TensorFlow, LiteRT, absl, the converter), "
                                "hidden by default; errors show either way")
    parser = argparse.ArgumentParser(prog="vit-keras", description="Vision Transformers for Keras 3.",
                                     parents=[verbosity])
    parser.add_argument("--version", action="version", version=f"vit-keras {__version__}",
                        help="print vit-keras's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="what to do; `vit-keras COMMAND --help` lists its options")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"vit_keras.apps.commands.{module_name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[verbosity])
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv=None):
    command = [word for word in sys.argv[1:] if word != "--verbose"][:1]
    if argv is None and command and command[0] in TCMALLOC_COMMANDS:  # a real process start
        reexec_with_tcmalloc()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    # Hiding the runtimes' logs changes process-wide state: only for a real process start, not a caller's argv.
    quiet = argv is None and not getattr(args, "verbose", False)
    try:
        with runtime_logs_hidden() if quiet else contextlib.nullcontext():
            return int(args.run(args) or 0)
    except (ValueError, OSError) as error:  # OSError: missing, unwritable, a full disk
        print(f"vit-keras {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
