"""One module per `vit-keras` subcommand.

Each module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules import only the standard library at top level, so building the parser
stays fast; heavy imports (TensorFlow, LiteRT) happen inside ``run``.
"""

import argparse

from vit_keras.constants import INFERENCE_PRECISIONS, MEMORY_BUDGET_FRACTION, RUNTIMES


DATA_DIR_HELP = ("tfds's data_dir, where tfds:NAME data is kept (default: tfds's own: $TFDS_DATA_DIR or "
                 "~/tensorflow_datasets)")


def positive_int(text):
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_runtime_arguments(parser, note=""):
    """--threads and --runtime, shared by the commands that run a .tflite on LiteRT; ``note`` ends their help."""
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="one number: the LiteRT CPU threads each inference uses (default: up to 4, or 1 where "
                             "the model runs faster on one, timed when the model loads)" + note)
    parser.add_argument("--runtime", choices=RUNTIMES, default="interpreter",
                        help="LiteRT API: interpreter, the classic Interpreter (default: %(default)s; measured as "
                             "fast or faster here), or compiled, CompiledModel" + note)


def add_precision_argument(parser, note=""):
    """--precision of a Keras model's inference (``vit_keras.predict``)."""
    parser.add_argument("--precision", choices=INFERENCE_PRECISIONS, default="float32",
                        help=f"{note}inference precision: bfloat16 on a CPU with bf16 units, int8 compiled by XLA; its "
                             "first 256 images are checked against float32, which it falls back to with a warning "
                             "(default: %(default)s)")


def add_input_arguments(parser):
    """--stream and --in-memory: how the data is read (``vit_keras.data.sources.load_splits``' input_mode; default:
    by its decoded size)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--stream", dest="input_mode", action="store_const", const="stream", default="auto",
                       help="stream the images from disk as they are read (folder: and shards: data); default: only "
                            f"data whose decoded images do not fit {MEMORY_BUDGET_FRACTION:.0%}% of the memory")
    group.add_argument("--in-memory", dest="input_mode", action="store_const", const="memory",
                       help="decode every image into memory first, however large the data")
