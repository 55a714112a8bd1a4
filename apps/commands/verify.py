"""`vit-keras verify`: an exported .tflite against its Keras model: size, latency, agreement, accuracy, score error."""

HELP = "Verify exported .tflite files against the Keras model: size, LiteRT latency, agreement, accuracy."


def add_arguments(parser):
    parser.add_argument("tflite", nargs="+", help="one or more exported .tflite files")
    parser.add_argument("--against", required=True, metavar="MODEL.keras", help="the Keras model they came from")
    parser.add_argument("--data", required=True, help="test data spec: fashion_mnist, tfds:NAME or folder:PATH")
    parser.add_argument("--split", default="test", help="data split (default test)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N test images")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per latency figure (median; default 50)")
    parser.add_argument("--threads", default="1,2", help="thread counts to time (default 1,2)")


def run(args):
    from convert.verify import verify_files

    threads = tuple(int(t) for t in args.threads.split(","))
    print(verify_files(args.tflite, args.against, args.data, split=args.split, limit=args.limit,
                       runs=args.runs, threads=threads))
    return 0
