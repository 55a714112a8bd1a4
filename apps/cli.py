"""The `vit-keras` command line: one front door that dispatches to a subcommand module."""

import argparse
import importlib
import sys

from .allocator import reexec_with_tcmalloc

# subcommand -> module under apps.commands
COMMANDS = {
    "train": "train",
    "evaluate": "evaluate",
    "export": "export",
    "verify": "verify",
    "classify": "classify",
    "serve": "serve",
    "explain": "explain",
    "inspect": "inspect_model",
    "bench": "bench",
}

# The commands whose work is TensorFlow compute, which tcmalloc speeds up (apps/allocator.py). The others run
# LiteRT or nothing heavy; `serve` tunes glibc's malloc for a long-lived process.
TCMALLOC_COMMANDS = ("train", "evaluate", "bench")


def build_parser():
    parser = argparse.ArgumentParser(prog="vit-keras", description="Vision Transformers for Keras 3.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"vit_keras.apps.commands.{module_name}")
        except ModuleNotFoundError as error:
            if error.name != f"vit_keras.apps.commands.{module_name}":
                raise
            continue  # a subcommand not yet shipped
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv=None):
    if argv is None and sys.argv[1:2] and sys.argv[1] in TCMALLOC_COMMANDS:  # a real process start
        reexec_with_tcmalloc()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except (ValueError, OSError) as error:  # OSError: missing, unwritable, a full disk
        print(f"vit-keras {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
