"""One module per `vit-keras` subcommand.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules import only the standard library at top level, so building the parser
stays fast; heavy imports (TensorFlow, LiteRT) happen inside ``run``.
"""
