"""`vit-keras classify MODEL IMAGE... [--top-k 5] [--json] [--output FILE]`: classify image files and folders.

MODEL is a .tflite (run by LiteRT, as on a device: no TensorFlow) or a .keras model (loaded with Keras, its images
run in batches through ``vit_keras.predict``). With --json, a file exported with --attention-output also gives each
image's attention map ("attention"). --output writes the results to a .csv or .json file as well.
"""

import os

from vit_keras.apps.commands import add_precision_argument, add_runtime_arguments, positive_int

HELP = ("Classify images with a .tflite model (LiteRT, labels and normalization from the model's metadata) or a "
        ".keras model.")

OUTPUTS = (".csv", ".json")  # --output's formats, by the file's ending
KERAS_BATCH = 32  # images a call of the .keras model


def add_arguments(parser):
    parser.add_argument("model", help="a .tflite exported by `vit-keras export` (runs on LiteRT, without TensorFlow), "
                                      "or a .keras model, e.g. a training run's model.keras (loads Keras)")
    parser.add_argument("images", nargs="+", metavar="IMAGE",
                        help="image files, or folders: their images, sorted, sub-folders included")
    parser.add_argument("--top-k", type=positive_int, default=5,
                        help="labels to show per image, most likely first (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead of text (with the attention map where the file has one)")
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="also write the results to FILE, written atomically: FILE.json, the document --json "
                             "prints; FILE.csv, one row an image: path, then label_1, score_1, ..., label_K, "
                             "score_K, most likely first (K: --top-k, at most the model's classes), then error (why "
                             "the image could not be read, its label and score cells empty). Default: none")
    add_runtime_arguments(parser, note="; a .tflite model only")
    add_precision_argument(parser, note="a .keras model only; ")


def check_output(path):
    """--output's format from its ending (".csv" or ".json"), or a clear error."""
    if path is None:
        return None
    ending = os.path.splitext(path)[1].lower()
    if ending not in OUTPUTS:
        raise ValueError(f"--output must name a {' or a '.join(OUTPUTS)} file; got {path!r}.")
    return ending


def is_keras(path):
    return str(path).lower().endswith(".keras")


def run(args):
    import sys

    from vit_keras.apps.images import list_images

    output = check_output(args.output)
    keras_model = is_keras(args.model)
    if keras_model and (args.threads is not None or args.runtime != "interpreter"):
        raise ValueError("--threads and --runtime set LiteRT's options: a .keras model takes neither.")
    if not keras_model and args.precision != "float32":
        raise ValueError("--precision sets a .keras model's inference; a .tflite file's precision is the one it "
                         "was exported in (`vit-keras export --mode`).")
    if keras_model and not os.path.isfile(args.model):  # before Keras loads
        raise FileNotFoundError(f"no such model file: {args.model}")
    files = list_images(args.images)
    if not files:
        raise ValueError("no images found in " + ", ".join(args.images))

    def show(result):  # as each result comes
        if args.json:
            return
        if "error" in result:
            print(f"{result['path']}: error: {result['error']}", file=sys.stderr)
            return
        ranked = "  ".join(f"{entry['label']} {entry['score']:.3f}" for entry in result["top"])
        print(f"{result['path']}  [{result['inference_ms']:.2f} ms model, {result['total_ms']:.2f} ms total]\n"
              f"    {ranked}")

    document = (classify_keras if keras_model else classify_tflite)(args, files, show)
    results = document["results"]
    if args.json:
        print(json_text(document))
    if output:
        write_results(args.output, output, document, args.top_k)
        if not args.json:
            print(f"results: {args.output}")
    return 1 if any("error" in result for result in results) else 0


def classify_tflite(args, files, show):
    """The --json document of ``files`` classified by the .tflite ``args.model`` on LiteRT, one image at a time;
    ``show(result)`` as each is done."""
    from vit_keras.apps.classifier import Classifier
    from vit_keras.apps.images import ImageError

    classifier = Classifier(args.model, threads=args.threads, runtime=args.runtime)
    results = []
    for path in files:
        try:
            p = classifier.classify(path, top_k=args.top_k)
        except ImageError as error:
            results.append({"path": path, "error": str(error)})
        else:
            results.append({"path": path, "top": [{"label": label, "score": round(score, 6)}
                                                  for label, score in p.top],
                            "inference_ms": round(p.inference_ms, 3), "total_ms": round(p.total_ms, 3)})
            if p.attention is not None:  # the file's own attention output, rows of the patch grid scaled to [0, 1]
                results[-1]["attention"] = [[round(float(v), 6) for v in row] for row in p.attention]
        show(results[-1])
    return {"model": classifier.name, "description": classifier.info.description,
            "input": {"height": classifier.height, "width": classifier.width,
                      "channels": classifier.channels, "dtype": str(classifier.input_dtype)},
            "timing": "per image: inference_ms the model's run, total_ms with decoding and resizing",
            "results": results}


def classify_keras(args, files, show):
    """The --json document of ``files`` classified by the .keras ``args.model``: the images decoded and resized as
    for a .tflite (0-255 pixels; normalized here where the model does not normalize them itself), run in batches
    through ``vit_keras.predict``; ``show(result)`` for each at the end. Labels: the model's class names, else
    labels.txt beside it, else "class N"."""
    import itertools
    import time

    import numpy as np

    import vit_keras
    from vit_keras.apps.classifier import fit_image
    from vit_keras.apps.commands.explain import read_labels
    from vit_keras.apps.images import ImageError, load_image
    from vit_keras.models.normalization import normalize

    model = vit_keras.load_model(args.model)
    config = model.vit_config
    if not config.get("include_top", True):
        raise ValueError(f"{args.model} has no classification head (include_top=False): it gives features, not "
                         "classes.")
    height, width = (int(v) for v in model.input_shape[1:3])
    channels, num_classes = int(config["channels"]), int(model.output_shape[-1])
    size = min(KERAS_BATCH, len(files))  # every batch this size (the last padded): the model compiles once
    rows, errors, timings = {}, {}, []  # path -> its row of predict's output; path -> error; batch -> its ms

    def batches():  # decoded as predict asks for them: one batch of images in memory at a time
        batch, start = [], time.perf_counter()
        for index, path in enumerate(files):
            try:
                image, _ = load_image(path, target_size=(width, height))
                batch.append(fit_image(image, width, height, channels))
                rows[path] = len(timings) * size + len(batch) - 1
            except ImageError as error:
                errors[path] = str(error)
            if len(batch) == size or (batch and index == len(files) - 1):
                pixels = np.zeros((size, height, width, channels), "float32")
                pixels[:len(batch)] = batch  # 0-255
                pixels = pixels if config["include_preprocessing"] else normalize(pixels, config)
                ready = time.perf_counter()
                yield pixels
                done = time.perf_counter()  # predict has run the batch and asks for the next
                timings.append({"inference_ms": round(1000 * (done - ready) / len(batch), 3),
                                "total_ms": round(1000 * (done - start) / len(batch), 3)})
                batch, start = [], time.perf_counter()

    pending = batches()
    first = next(pending, None)  # None: not one image could be read
    top = None if first is None else vit_keras.predict(model, itertools.chain([first], pending),
                                                       top_k=min(args.top_k, num_classes), precision=args.precision)
    names = None if model.class_names else read_labels(args.model)  # labels.txt of a run saved before class_names
    if names is not None and len(names) != num_classes:
        names = None
    results = []
    for path in files:
        if path in errors:
            results.append({"path": path, "error": errors[path]})
        else:
            row = rows[path]
            labels = [names[i] for i in top.indices[row]] if names else top.labels[row].tolist()
            results.append({"path": path, "top": [{"label": str(label), "score": round(float(score), 6)}
                                                  for label, score in zip(labels, top.scores[row])],
                            **timings[row // size]})
        show(results[-1])
    return {"model": os.path.splitext(os.path.basename(args.model))[0],
            "description": f"Keras VisionTransformer ({config['num_layers']} layers, width {config['hidden_size']}, "
                           f"patch {config['patch_size']}), {num_classes} classes",
            "input": {"height": height, "width": width, "channels": channels, "dtype": "float32"},
            "timing": f"per image, its batch's time divided by the batch's images (batches of {size} through "
                      "vit_keras.predict; the first batch's includes compiling the model): inference_ms the model's "
                      "run, total_ms with decoding and resizing",
            "results": results}


def json_text(document):
    import json

    return json.dumps(document, indent=2)


def write_results(path, ending, document, top_k):
    """``document``'s results as ``path`` (written atomically): the JSON document, or CSV rows (--output's help)."""
    import csv
    import io

    from vit_keras.files import write_bytes

    if ending == ".json":
        write_bytes(path, (json_text(document) + "\n").encode("utf-8"))
        return
    results = document["results"]
    k = max((len(result["top"]) for result in results if "top" in result), default=top_k)  # K <= the classes
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", *(f"{name}_{i}" for i in range(1, k + 1) for name in ("label", "score")), "error"])
    for result in results:
        cells = [(entry["label"], f"{entry['score']:.6f}") for entry in result.get("top", ())]
        cells += [("", "")] * (k - len(cells))
        writer.writerow([result["path"], *(cell for pair in cells for cell in pair), result.get("error", "")])
    write_bytes(path, text.getvalue().encode("utf-8"))
