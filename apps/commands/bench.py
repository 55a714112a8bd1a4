"""`vit-keras bench`: inference images/s of ViT-Ti/S/B at 224 (float32 with XLA on and off, bfloat16, int8),
against the matmul peaks and timm."""

from vit_keras.apps.commands import positive_int
from vit_keras.constants import BENCH_MODELS as MODELS
from vit_keras.constants import INFERENCE_PRECISIONS

HELP = ("inference throughput of ViT-Ti/16, S/16, B/16 (float32 XLA on/off, bfloat16, int8), share of the fp32 "
        "and bf16 matmul peaks, and timm's, same run")


def add_arguments(parser):
    parser.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME",
                        help="plain ViT names to time (default: %s)" % " ".join(MODELS))
    parser.add_argument("--batch-size", type=positive_int, default=16, help="images a batch (default: %(default)s)")
    parser.add_argument("--image-size", type=positive_int, default=224,
                        help="the models' input side in pixels (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed calls of each model and mode; the median counts (default: %(default)s)")
    parser.add_argument("--precision", nargs="+", choices=INFERENCE_PRECISIONS, default=list(INFERENCE_PRECISIONS),
                        dest="precisions", help="precisions to time, as vit_keras.predict runs them (default: %(default)s)")
    parser.add_argument("--timm-python", default=None, metavar="PYTHON",
                        help="an interpreter that has torch and timm (default: this one)")


def run(args):
    from vit_keras.inference.bench import main

    main(args.models, args.batch_size, args.image_size, args.repeats, args.timm_python, args.precisions)
    return 0
