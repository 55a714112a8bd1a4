"""`vit-keras verify`: an exported .tflite against its Keras model: size, latency, agreement, accuracy, score error."""

PER_LAYER_IMAGES = 100  # --per-layer runs the reference kernels, slower than XNNPACK: a sample by default
HELP = "Verify exported .tflite files against the Keras model: size, LiteRT latency, agreement, accuracy."


def add_arguments(parser):
    parser.add_argument("tflite", nargs="+", help="one or more exported .tflite files")
    parser.add_argument("--against", required=True, metavar="MODEL.keras", help="the Keras model they came from")
    parser.add_argument("--data", required=True,
                        help="test data spec: fashion_mnist, tfds:NAME, folder:PATH or shards:PATH")
    parser.add_argument("--split", default="test", help="data split (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="a seeded, class-balanced sample of N test images (it prints how many of each class; "
                             "default: all of them, or with --per-layer the first %d)" % PER_LAYER_IMAGES)
    parser.add_argument("--runs", type=int, default=50,
                        help="timed runs per latency figure, their median shown (default: %(default)s)")
    parser.add_argument("--threads", default="1,2", metavar="N[,N...]",
                        help="a list: the LiteRT thread counts to time, comma-separated, one latency column each "
                             "(default: %(default)s)")
    parser.add_argument("--per-layer", action="store_true",
                        help="instead of the table: each quantized tensor's int8 error against the same graph in "
                             "float, worst first (on the first --limit images; default %d)" % PER_LAYER_IMAGES)
    parser.add_argument("--top", type=int, default=None, metavar="N",
                        help="with --per-layer: show the worst N tensors only (default: all)")


def run(args):
    try:
        threads = tuple(int(t) for t in args.threads.split(","))
    except ValueError:
        threads = ()
    if not threads or min(threads) < 1:
        raise ValueError(f"--threads must be positive integers separated by commas, e.g. 1,2; got {args.threads!r}.")
    for name in ("runs", "limit", "top"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be a positive integer; got {value}.")
    if args.per_layer:
        from vit_keras.convert.quant_report import layer_report_files

        print(layer_report_files(args.tflite, args.against, args.data, split=args.split, top=args.top,
                                 limit=args.limit or PER_LAYER_IMAGES))
        return 0
    from vit_keras.convert.verify import verify_files

    print(verify_files(args.tflite, args.against, args.data, split=args.split, limit=args.limit,
                       runs=args.runs, threads=threads))
    return 0
