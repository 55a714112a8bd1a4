"""`vit-keras export`: a trained .keras ViT -> .tflite with metadata (labels, normalization) for Android/MediaPipe."""

HELP = "Export a trained ViT (.keras) to TFLite (float32|float16|dynamic|int8) with metadata."
from vit_keras.constants import (DEFAULT_CALIBRATION_IMAGES, EXPORT_TARGETS, INT8_ACTIVATIONS, INT8_RANGES,
                                 QUANTIZATIONS)


def add_arguments(parser):
    parser.add_argument("model", help="a .keras model: a training run's, or one saved from Python (its class names "
                                      "are the labels; a model without them reads labels.txt from beside it)")
    parser.add_argument("--quantize", default="int8", metavar="|".join(QUANTIZATIONS),
                        help="float32, float16, dynamic (range), or int8 (uint8 input, int8 weights; default). "
                             "float32, float16 and static int8 (--int8-activations) run on TFLite 2.9 and newer "
                             "(tflite-runtime 2.9+). dynamic, and int8 with dynamic activations, need TFLite 2.17 "
                             "(ai-edge-litert): their int8 weights per output channel make FULLY_CONNECTED op "
                             "version 12, which tflite-runtime (last release 2.14) and the TFLite Task Library 0.4.4 "
                             "refuse")
    parser.add_argument("--calibration", default=None, metavar="DATA",
                        help="training data spec for int8 calibration: fashion_mnist, tfds:NAME or folder:PATH "
                             "(default: none; int8 needs it, float modes take none)")
    parser.add_argument("--calibration-size", type=int, default=DEFAULT_CALIBRATION_IMAGES,
                        help="calibration images (default %(default)s)")
    parser.add_argument("--int8-activations", default="auto", metavar="|".join(INT8_ACTIVATIONS),
                        help="int8's activations: dynamic (int8 weights, each layer's input rounded to int8 a token "
                             "at a time as it runs; TFLite 2.17+), static (full integer, one scale a tensor fixed at "
                             "calibration, for integer-only accelerators and TFLite 2.9+) or auto (default: dynamic "
                             "for models from ViT-Ti's width 192 up, static below, or with --ranges / "
                             "--min-agreement)")
    parser.add_argument("--ranges", default=None, metavar="|".join(INT8_RANGES),
                        help="static int8's activation ranges: mse (the least rounding and clipping error over the "
                             "calibration images; default) or minmax (their min and max)")
    parser.add_argument("--min-agreement", type=float, default=None, metavar="FRACTION",
                        help="static int8: keep in float what makes top-1 agreement with Keras, on a held-out part of "
                             "the calibration images (5 / (1 - FRACTION) of them), at least this, in the smallest "
                             "file (e.g. 0.995, with --calibration-size 1300); prints the rows tried")
    parser.add_argument("--target", choices=EXPORT_TARGETS, default="cpu",
                        help="what runs the file: cpu (default: the file --quantize gives, for LiteRT's CPU and GPU "
                             "paths) or npu (a full-integer file for phone NPUs through LiteRT's NPU plugins: int8 "
                             "weights, int16 activations, uint8 input, int16 scores; needs --quantize int8 and "
                             "--calibration, and takes none of --int8-activations, --ranges, --min-agreement, "
                             "--attention-output, --dynamic-batch)")
    parser.add_argument("--out", default="model.tflite",
                        help="output .tflite, written atomically (default: %(default)s)")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class names, one a line (default: the model's own class names, else labels.txt beside "
                             "MODEL)")
    parser.add_argument("--dynamic-batch", action="store_true",
                        help="a dynamic batch dimension instead of batch 1 (the default)")
    parser.add_argument("--attention-output", action="store_true",
                        help="a second output: the attention rollout over the patch grid, (1, grid_h, grid_w), "
                             "which classify, serve and export-web draw over the image")
    parser.add_argument("--name", default=None, help="model name in the metadata (default: the Keras model's name)")
    parser.add_argument("--description", default=None,
                        help="model description in the metadata (default: one made from its shape, mode and class "
                             "count)")
    parser.add_argument("--version", default="1", help="model version in the metadata (default: %(default)s)")
    parser.add_argument("--license", default="Apache-2.0", help="license in the metadata (default: %(default)s)")


def run(args):
    if args.quantize not in QUANTIZATIONS:  # before the slow imports
        raise ValueError(f"Unknown --quantize {args.quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
    if args.int8_activations not in INT8_ACTIVATIONS:
        raise ValueError(f"Unknown --int8-activations {args.int8_activations!r}; valid values are "
                         f"{', '.join(INT8_ACTIVATIONS)}.")
    if args.ranges is not None and args.ranges not in INT8_RANGES:
        raise ValueError(f"Unknown --ranges {args.ranges!r}; valid values are {', '.join(INT8_RANGES)}.")
    if args.quantize == "int8" and not args.calibration:
        raise ValueError("--quantize int8 (the default) needs --calibration DATA: the training data spec "
                         "(fashion_mnist, tfds:NAME or folder:PATH). Float modes need none.")
    from vit_keras.convert.export import export_tflite
    from vit_keras.constants import MIN_CALIBRATION_IMAGES

    if args.quantize == "int8" and args.calibration_size < MIN_CALIBRATION_IMAGES:  # before any data loads
        raise ValueError(f"--calibration-size must be at least {MIN_CALIBRATION_IMAGES}; got {args.calibration_size}.")

    summary = export_tflite(
        args.model, args.out, quantize=args.quantize, calibration=args.calibration, labels=args.labels,
        dynamic_batch=args.dynamic_batch, calibration_size=args.calibration_size,
        min_agreement=args.min_agreement, ranges=args.ranges, int8_activations=args.int8_activations,
        attention_output=args.attention_output, target=args.target, name=args.name,
        description=args.description, version=args.version, license=args.license,
    )
    mode = summary["quantize"] + (", npu target" if args.target == "npu" else "")
    print(f"wrote {summary['path']} ({summary['bytes'] / 1e6:.2f} MB, {mode}, input "
          f"{summary['input_dtype']} {summary['input_shape']}, {summary['labels']} labels); "
          f"runs on {summary['runtime']}")
    if "sweep" in summary:
        from vit_keras.convert.sensitivity import format_sweep

        print(f"ops kept in float: the smallest file meeting --min-agreement {args.min_agreement} on the held-out "
              "images\n"
              + format_sweep(summary["sweep"]))
    return 0
