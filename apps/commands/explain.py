"""`vit-keras explain MODEL.keras IMAGE... --out DIR`: where the model looks, as an attention-rollout overlay PNG."""

import os

HELP = "Draw where a model looks in an image: an attention-rollout overlay PNG per image."


def add_arguments(parser):
    parser.add_argument("model", help="a saved VisionTransformer (.keras)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image file(s); resized to the model's input")
    parser.add_argument("--out", required=True, help="folder for IMAGE_NAME_attention.png")
    parser.add_argument("--alpha", type=float, default=0.5,
                        help="opacity of the heatmap over the image, 0-1 (default: %(default)s)")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class names, one a line (default: labels.txt beside the model, else \"class N\")")


def read_labels(model_path, labels_path=None):
    """Class names from --labels or labels.txt beside the model; None when there are none."""
    path = labels_path or os.path.join(os.path.dirname(os.path.abspath(model_path)), "labels.txt")
    if not os.path.exists(path):
        if labels_path:
            raise FileNotFoundError(f"--labels file not found: {labels_path}")
        return None
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def run(args):
    if not 0.0 <= args.alpha <= 1.0:
        raise ValueError(f"--alpha must be in [0, 1]; got {args.alpha}.")
    for image in args.images:
        if not os.path.isfile(image):
            raise FileNotFoundError(f"image not found: {image}")
    import numpy as np

    from vit_keras import visualize
    from vit_keras.models.vision_transformer import load_model

    model = load_model(args.model)
    labels = read_labels(args.model, args.labels)
    images = np.stack([visualize.load_image(path, model) for path in args.images])
    heatmaps = visualize.attention_heatmap(model, images)
    logits = model.predict(visualize.model_inputs(model, images), verbose=0) if model.vit_config["include_top"] else None
    os.makedirs(args.out, exist_ok=True)
    names = output_names(args.images)
    for index, path in enumerate(args.images):
        title = None
        if logits is not None:
            scores = np.exp(logits[index] - logits[index].max())
            top = int(scores.argmax())
            name = labels[top] if labels and top < len(labels) else f"class {top}"
            title = f"{name} ({100 * scores[top] / scores.sum():.0f}%)"
        written = visualize.plot_attention_overlay(images[index], heatmaps[index],
                                                   os.path.join(args.out, names[index]), title=title, alpha=args.alpha)
        print(f"{path}: {title or ''} -> {written}")
    return 0


def output_names(paths):
    """``<stem>_attention.png`` per image; a name already taken (the same file name in another folder) gets
    the lowest free number, ``<stem>_<n>_attention.png``."""
    names = []
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        name, n = f"{stem}_attention.png", 1
        while name in names:
            name, n = f"{stem}_{n}_attention.png", n + 1
        names.append(name)
    return names
