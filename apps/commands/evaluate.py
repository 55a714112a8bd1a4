"""`vit-keras evaluate`: loss, accuracy and a per-class table of a trained model on a dataset's test split."""

import os

from vit_keras.apps.commands import DATA_DIR_HELP, add_input_arguments, add_precision_argument
from vit_keras.constants import SPLITS, VAL_FRACTION

HELP = "Evaluate a trained model (.keras): loss, accuracy, per-class table, optional confusion-matrix PNG."


def add_arguments(parser):
    parser.add_argument("model", help="a trained model, e.g. runs/fashion_mnist/model.keras")
    parser.add_argument("--data", default="fashion_mnist",
                        help="fashion_mnist | tfds:NAME | folder:PATH | shards:PATH (default: %(default)s)")
    add_input_arguments(parser)
    add_precision_argument(parser)
    parser.add_argument("--split", choices=SPLITS, default="test",
                        help="split to evaluate: a folder of train/ + test/ folders gives its test/; the folder the "
                             "model was trained on, its seeded held-out part; any other folder, all of it "
                             "(default: %(default)s)")
    parser.add_argument("--confusion", default=None, metavar="PNG",
                        help="write the confusion matrix as this PNG (default: none)")
    parser.add_argument("--batch-size", type=int, default=256, help="images a batch (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="evaluate a seeded, class-balanced sample of N images (it prints how many of each "
                             "class; default: all of them)")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="a folder's held-out fraction (default: the training run's, from its config.json; else "
                             f"{VAL_FRACTION:g})")
    parser.add_argument("--seed", type=int, default=None,
                        help="the folder split's seed (default: the training run's, from its config.json; else 0)")


def run(args):
    if not os.path.isfile(args.model):
        raise FileNotFoundError(f"Model {args.model!r} does not exist (expected a .keras file from `vit-keras train`).")
    if not args.model.endswith(".keras"):
        raise ValueError(f"MODEL must be a .keras file; got {args.model!r}.")
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ValueError("--batch-size and --limit must be positive integers.")
    from vit_keras.data.sources import load_splits
    from vit_keras.inference.precision import precision_line
    from vit_keras.models.vision_transformer import load_model
    from vit_keras.training.evaluation import evaluate_arrays, evaluate_source, format_report, label_mapping
    from vit_keras.training.runs import data_split
    from vit_keras.visualize import plot_confusion_matrix

    model = load_model(args.model)
    trained = data_split(args.model, args.data)
    seed = args.seed if args.seed is not None else trained.get("seed", 0)
    val_fraction = args.val_fraction if args.val_fraction is not None else trained.get("val_fraction", VAL_FRACTION)
    whole = trained.get("whole_folder", False) and args.seed is None and args.val_fraction is None
    (data,), mode, why = load_splits(args.data, [args.split], args.input_mode, limit=args.limit, seed=seed,
                                     data_dir=args.data_dir, val_fraction=val_fraction,
                                     image_size=model.input_shape[1:3], whole_folder=whole)
    labels_path = os.path.join(os.path.dirname(os.path.abspath(args.model)), "labels.txt")
    names = None
    if os.path.exists(labels_path):
        with open(labels_path, encoding="utf-8") as f:
            names = [line.rstrip("\n") for line in f if line.strip()]
    num_classes = int(model.output_shape[-1])
    mapping = label_mapping(data.class_names, names, num_classes)
    print(f"{args.model} on {args.data} ({args.split}): {len(data):,} images"
          + (f", {data.source}" if data.source else "") + f"; its classes {mapping.how}")
    print(f"input: {'streamed from disk' if mode == 'stream' else 'in memory'}: {why}")
    if data.skipped:
        print(f"skipped {len(data.skipped)} unreadable image(s)")
    if not mapping:
        print("accuracy: not stated; the data's classes are not the model's (name the folders after the model's "
              "labels, or by class index: 0, 1, ... or 0000, 0001, ...)")
        return 0
    class_names = names if names is not None and len(names) == num_classes else data.class_names
    if len(class_names) != num_classes:
        class_names = [str(i) for i in range(num_classes)]
    if mode == "stream":
        result = evaluate_source(model, data, args.batch_size, mapping, class_names, args.precision)
        if data.skipped:
            print(f"skipped {len(data.skipped)} unreadable image(s) while streaming")
    else:
        result = evaluate_arrays(model, data.images, mapping.labels(data.labels), class_names,
                                 batch_size=args.batch_size, precision=args.precision)
    print(format_report(result))
    if args.precision != "float32":
        print(precision_line(model, args.precision))
    if args.confusion:
        plot_confusion_matrix(result["confusion"], class_names, args.confusion,
                              title=f"{os.path.basename(args.model)} on {args.data}: accuracy {result['accuracy']:.4f}")
        print(f"confusion matrix: {args.confusion}")
    return 0
