"""`vit-keras classify MODEL.tflite IMAGE... [--top-k 5] [--json]`: classify image files and folders.

With --json, a file exported with --attention-output also gives each image's attention map ("attention").
"""

from vit_keras.apps.commands import add_runtime_arguments, positive_int

HELP = "Classify images with a .tflite model (LiteRT, labels and normalization from the model's metadata)."


def add_arguments(parser):
    parser.add_argument("model", help="a .tflite exported by `vit-keras export`")
    parser.add_argument("images", nargs="+", help="image files or folders of images")
    parser.add_argument("--top-k", type=positive_int, default=5, help="labels to show per image (default 5)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead of text (with the attention map where the file has one)")
    add_runtime_arguments(parser)


def run(args):
    import json
    import sys

    from vit_keras.apps.classifier import Classifier
    from vit_keras.apps.images import ImageError, list_images

    files = list_images(args.images)
    if not files:
        raise ValueError("no images found in " + ", ".join(args.images))
    classifier = Classifier(args.model, threads=args.threads, runtime=args.runtime)
    results, failures = [], 0
    for path in files:
        try:
            p = classifier.classify(path, top_k=args.top_k)
        except ImageError as error:
            failures += 1
            results.append({"path": path, "error": str(error)})
            if not args.json:
                print(f"{path}: error: {error}", file=sys.stderr)
            continue
        results.append({"path": path, "top": [{"label": label, "score": round(score, 6)} for label, score in p.top],
                        "inference_ms": round(p.inference_ms, 3), "total_ms": round(p.total_ms, 3)})
        if p.attention is not None:  # the file's own attention output, rows of the patch grid scaled to [0, 1]
            results[-1]["attention"] = [[round(float(v), 6) for v in row] for row in p.attention]
        if not args.json:
            ranked = "  ".join(f"{label} {score:.3f}" for label, score in p.top)
            print(f"{path}  [{p.inference_ms:.2f} ms model, {p.total_ms:.2f} ms total]\n    {ranked}")
    if args.json:
        document = {"model": classifier.name, "description": classifier.info.description,
                    "input": {"height": classifier.height, "width": classifier.width,
                              "channels": classifier.channels, "dtype": str(classifier.input_dtype)},
                    "results": results}
        print(json.dumps(document, indent=2))
    return 1 if failures else 0
