"""`vit-keras inspect MODEL.keras --out DIR`: the paper's Fig. 7 for your model.

Writes attention_distance.png (mean attention distance per head against depth, over
sample images normalized by the model's pixel_mean / pixel_std), position_similarity.png
(cosine similarity of the position embeddings) and embedding_filters.png (principal components
of the patch-embedding filters), plus inspect.json with the numbers and the input normalization.
A figure that does not apply (no position embedding, a hybrid's 1x1 patches) is skipped with a note.
"""

import json
import os

HELP = "Draw the paper's Fig. 7 for a model: attention distance, position-embedding similarity, filter PCA."


def add_arguments(parser):
    parser.add_argument("model", help="a saved VisionTransformer (.keras)")
    parser.add_argument("--out", required=True, help="folder for the PNGs and inspect.json")
    parser.add_argument("--images", nargs="*", default=None, metavar="IMAGE",
                        help="image files for the attention distance (default: --data)")
    parser.add_argument("--data", default="fashion_mnist",
                        help="dataset spec for sample images: fashion_mnist | tfds:NAME | folder:PATH "
                             "(default: %(default)s)")
    parser.add_argument("--limit", type=int, default=256, help="how many sample images (default 256)")
    parser.add_argument("--components", type=int, default=28, help="principal components to draw (default 28)")


def sample_images(args, model):
    """0-255 float images at the model's input size and channels."""
    import numpy as np

    from vit_keras import visualize

    if args.images:
        return np.stack([visualize.load_image(path, model) for path in args.images])
    from vit_keras.data.datasets import load_arrays
    from vit_keras.data.pipeline import fit_images

    images, _, _ = load_arrays(args.data, split="test", limit=args.limit, seed=0, image_size=model.input_shape[1:3])
    return fit_images(images, model.input_shape[1:3], model.input_shape[3]).astype("float32")


def run(args):
    if args.limit < 1:
        raise ValueError(f"--limit must be >= 1; got {args.limit}.")
    if args.components < 1:
        raise ValueError(f"--components must be >= 1; got {args.components}.")
    from vit_keras import visualize
    from vit_keras.files import write_text
    from vit_keras.models.vision_transformer import load_model
    from vit_keras.models.normalization import describe, pixel_normalization

    model = load_model(args.model)
    os.makedirs(args.out, exist_ok=True)
    mean, std = (values / 255.0 for values in pixel_normalization(model.vit_config))
    summary = {"input_normalization": {"mean": mean.round(6).tolist(), "std": std.round(6).tolist()}}
    where = "by the model" if model.preprocessing is not None else "here, before the model"
    print(f"input normalization: {describe(model.vit_config)}, applied {where}")
    images = sample_images(args, model)  # 0-255 pixels, normalized as above by visualize.model_inputs
    distance = visualize.attention_distance(model, images)
    summary["attention_distance_px"] = distance.round(3).tolist()
    path = visualize.plot_attention_distance(distance, os.path.join(args.out, "attention_distance.png"))
    print(f"mean attention distance per block (px): {', '.join(f'{d:.1f}' for d in distance.mean(axis=1))} -> {path}")

    if model.patch_encoder.position_embedding == "none":
        print("position_similarity.png skipped: the model has no position embedding")
    else:
        similarity = visualize.position_similarity(model)
        path = visualize.plot_position_similarity(similarity, os.path.join(args.out, "position_similarity.png"))
        print(f"position-embedding similarity ({similarity.shape[0]}x{similarity.shape[1]} grid) -> {path}")

    components, ratio = visualize.embedding_components(model, args.components)
    summary["embedding_explained_variance"] = ratio.round(5).tolist()
    if components.shape[-1] in (1, 3) and components.shape[1] > 1:
        path = visualize.plot_embedding_components(components, os.path.join(args.out, "embedding_filters.png"), ratio)
        print(f"{len(components)} principal components of the patch-embedding filters -> {path}")
    else:
        print("embedding_filters.png skipped: the embedding takes 1x1 patches of a stem's feature map, not pixels")
    write_text(os.path.join(args.out, "inspect.json"), json.dumps(summary, indent=1))
    return 0
