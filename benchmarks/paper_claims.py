"""Test the ViT paper's claims at small scale on Fashion-MNIST, on a CPU.

    .venv/bin/python benchmarks/paper_claims.py            # the default budget (see --help); writes docs/
    .venv/bin/python benchmarks/paper_claims.py --quick    # a smoke run in a few minutes

(a) position embedding: none vs learned 1-D vs learned 2-D vs fixed 2-D sin-cos;
(b) class token vs global average pooling (GAP), each at three learning rates;
(c) conv-stem hybrid vs pure ViT at (no more than) equal compute: FLOPs, params, time;
(d) mean attention distance by depth in a trained model (and at initialization), plus
    how much the learned 1-D position embedding picks up the 2-D row/column structure.

Model: 32 x 32 images (Fashion-MNIST zero-padded from 28), 8 x 8 patches (a 4 x 4 grid),
hidden 64, 4 heads, MLP 128, 6 blocks; AdamW, linear warm-up then cosine decay, batch 128,
in-memory arrays (``--jit`` for XLA). Results go to docs/paper_claims.{json,md} and docs/claims_*.png.
Each run's result is cached in the JSON, so ``--resume`` continues an interrupted run.
"""

import argparse
import gzip
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BASE = dict(image_size=32, patch_size=8, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=6, num_classes=10,
            channels=1, include_preprocessing=True)
BASE_LR = 1e-3
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
POSITIONS = ("none", "learned", "learned_2d", "sincos_2d")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(split, limit, seed):
    """uint8 (N, 32, 32, 1) images zero-padded from 28 x 28, and int labels."""
    try:
        from vit_keras.data.datasets import load_arrays

        images, labels, _ = load_arrays("fashion_mnist", split=split, limit=limit, seed=seed)
    except ImportError:  # before vit_keras.data.datasets existed: read the IDX files directly
        prefix = "train" if split == "train" else "t10k"

        def idx(name):
            with gzip.open(os.path.join(FASHION_DIR, f"{prefix}-{name}-idx{3 if name == 'images' else 1}-ubyte.gz")) as f:
                data = f.read()
            dims = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)

        images, labels = idx("images")[..., None], idx("labels").astype("int64")
        order = np.random.default_rng(seed).permutation(len(images))[:limit]
        images, labels = images[order], labels[order]
    return np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0))), labels


def count_flops(model):
    """Forward FLOPs per image (2 x multiply-adds of convolutions and matmuls; norms and softmax left out)."""
    import vit_keras

    config = model.get_config()
    macs = 0
    height, width = config["image_size"]
    if config["stem"] == "conv":
        for conv, _ in model.stem.blocks:
            height, width = -(-height // 2), -(-width // 2)
            kh, kw, cin, cout = conv.kernel.shape
            macs += height * width * kh * kw * cin * cout
    embedding = model.patch_encoder
    kh, kw, cin, d = embedding.kernel.shape
    macs += embedding.num_patches * kh * kw * cin * d
    tokens = embedding.num_tokens
    per_block = tokens * d * 3 * d + 2 * tokens * tokens * d + tokens * d * d + 2 * tokens * d * config["mlp_dim"]
    macs += per_block * len([l for l in model.layers if isinstance(l, vit_keras.TransformerBlock)])
    macs += d * config["num_classes"]
    return 2 * macs


def train(config, lr, seed, data, epochs, batch_size, jit_compile=False):
    import keras

    import vit_keras

    keras.utils.set_random_seed(seed)
    model = vit_keras.VisionTransformer(**{**BASE, **config})
    (x, y), (x_test, y_test) = data
    steps = epochs * -(-len(x) // batch_size)
    warmup = max(steps // 10, 1)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps - warmup, warmup_target=lr, warmup_steps=warmup)
    model.compile(keras.optimizers.AdamW(schedule, weight_decay=1e-4, global_clipnorm=1.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=jit_compile)
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(x_test, y_test, batch_size=512, verbose=0)
    extra = {}
    batch_norms = [bn for _, bn in model.stem.blocks] if config.get("stem") == "conv" else []
    if batch_norms:
        # BatchNorm's moving statistics can lag after ~200 steps; recompute them on 2000 training images
        # (one forward pass, no weight update) and evaluate again.
        extra["test_accuracy_stale_batchnorm"] = float(accuracy)
        momenta = [layer.momentum for layer in batch_norms]
        for layer in batch_norms:
            layer.momentum = 0.0
        model(x[:2000].astype("float32"), training=True)
        for layer, momentum in zip(batch_norms, momenta):
            layer.momentum = momentum
        _, accuracy = model.evaluate(x_test, y_test, batch_size=512, verbose=0)
    result = dict(config=config, lr=lr, seed=seed, test_accuracy=float(accuracy), **extra,
                  train_accuracy=float(history.history["accuracy"][-1]), train_seconds=round(seconds, 1),
                  params=int(model.count_params()), flops=count_flops(model))
    return model, result


def row_column_score(similarity):
    """Share of each patch's k most similar other patches that lie in its row or column (k = gh + gw - 2)."""
    gh, gw = similarity.shape[:2]
    flat = similarity.reshape(gh * gw, gh * gw).copy()
    np.fill_diagonal(flat, -np.inf)
    k = gh + gw - 2
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    shared = (rows[:, None] == rows[None]) | (cols[:, None] == cols[None])
    top = np.argsort(-flat, axis=1)[:, :k]
    return float(np.take_along_axis(shared, top, axis=1).mean()), k / (gh * gw - 1)


def summarize(values):
    values = np.asarray(values, dtype="float64")
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=8000, help="training images (a fixed random subset)")
    parser.add_argument("--test", type=int, default=4000, help="test images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds for (a) and (c)")
    parser.add_argument("--lr-seeds", type=int, nargs="+", default=[0], help="seeds for (b)")
    parser.add_argument("--jit", action="store_true",
                        help="XLA-compile the steps: on a busy 2-core CPU compiling cost more than it saved for this "
                             "16-token model; try it on a quiet machine")
    parser.add_argument("--out", default=None, help="default: docs/, or a new temp folder with --quick")
    parser.add_argument("--resume", action="store_true", help="reuse the runs already in OUT/paper_claims.json")
    parser.add_argument("--report-only", action="store_true",
                        help="redraw claims_accuracy.png and rewrite paper_claims.md from OUT/paper_claims.json")
    parser.add_argument("--inside-only", action="store_true",
                        help="only (d), usually with a longer budget: writes OUT/paper_claims_long.json and "
                             "OUT/claims_long_*.png, which the report adds as a section")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1000 images, 1 epoch, 1 seed")
    args = parser.parse_args(argv)
    if args.quick:  # a smoke run: never over the committed figures in docs/
        args.train, args.test, args.epochs, args.seeds, args.lr_seeds = 1000, 500, 1, [0], [0]
        args.out = args.out or tempfile.mkdtemp(prefix="paper_claims_quick_")
    args.out = args.out or "docs"

    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(args.out, "paper_claims_long.json" if args.inside_only else "paper_claims.json")
    prefix = os.path.join(args.out, "claims_long_" if args.inside_only else "claims_")
    if args.report_only:
        with open(store) as f:
            budget = json.load(f)["budget"]
        args.seeds, args.lr_seeds = budget["seeds"], budget["lr_seeds"]
        return write_outputs(store, args)

    import keras

    from vit_keras import visualize

    runs, inside, earlier_seconds = {}, {}, 0.0
    if args.resume and os.path.exists(store):
        with open(store) as f:
            earlier = json.load(f)
        runs, earlier_seconds = earlier["runs"], earlier["budget"].get("wall_seconds", 0.0)
        inside = earlier.get("inside", {})
    data = (load_fashion_mnist("train", args.train, 0), load_fashion_mnist("test", args.test, 1))
    started = time.perf_counter()
    budget = dict(jit_compile=args.jit, train_images=len(data[0][0]), test_images=len(data[1][0]), epochs=args.epochs,
                  batch_size=args.batch_size, seeds=args.seeds, lr_seeds=args.lr_seeds, model=BASE, base_lr=BASE_LR,
                  cpu_count=os.cpu_count(), load_average_at_start=os.getloadavg()[0])
    kept_models = {}

    def run(key, config, lr, seed, keep=False):
        if key in runs and not keep:
            return runs[key]
        model, result = train(config, lr, seed, data, args.epochs, args.batch_size, args.jit)
        runs[key] = result
        if keep:
            kept_models[key] = model
        print(f"{key:32s} acc {result['test_accuracy']:.4f}  {result['train_seconds']:7.1f} s", flush=True)
        write_json(store, dict(budget=budget, runs=runs, inside=inside))
        return result

    # (d) first, on the learned-1D model of the first seed, so its figures exist even if a later run is cut short:
    # attention distance in the trained model vs the same architecture at initialization.
    key = f"a/learned/seed{args.seeds[0]}"
    run(key, dict(position_embedding="learned"), BASE_LR, args.seeds[0], keep=True)
    trained = kept_models.pop(key)
    keras.utils.set_random_seed(args.seeds[0])
    initial = type(trained).from_config(trained.get_config())
    probe = data[1][0][:500]
    inside.update(
        distance_trained=visualize.attention_distance(trained, probe).tolist(),
        distance_init=visualize.attention_distance(initial, probe).tolist(),
        row_column_trained=row_column_score(visualize.position_similarity(trained)),
        row_column_init=row_column_score(visualize.position_similarity(initial)),
        model_seed=args.seeds[0],
    )
    visualize.plot_attention_distance(
        {"trained": np.array(inside["distance_trained"]), "initialization": np.array(inside["distance_init"])},
        prefix + "attention_distance.png",
        title="Mean attention distance, Fashion-MNIST ViT (4x4 patches of 8 px)")
    visualize.plot_position_similarity(visualize.position_similarity(trained),
                                       prefix + "position_similarity.png",
                                       title="Learned 1-D position embedding: cosine similarity")
    components, ratio = visualize.embedding_components(trained)
    visualize.plot_embedding_components(components, prefix + "embedding_filters.png", ratio)
    heatmaps = visualize.attention_heatmap(trained, probe[:4])
    for index in range(4):
        visualize.plot_attention_overlay(probe[index], heatmaps[index],
                                         f"{prefix}attention_overlay_{index}.png")
    write_json(store, dict(budget=budget, runs=runs, inside=inside))
    del trained, initial
    if args.inside_only:
        return 0

    # (c) conv stem with one block fewer (its stem costs less than a block) vs the pure ViT of (a).
    for seed in args.seeds:
        run(f"c/conv_stem/seed{seed}", dict(stem="conv", num_layers=BASE["num_layers"] - 1), BASE_LR, seed)
    # (a) position embeddings at the base learning rate, token pooling.
    for seed in args.seeds:
        for position in POSITIONS:
            run(f"a/{position}/seed{seed}", dict(position_embedding=position), BASE_LR, seed)
    # (b) class token vs GAP, each at three learning rates; (a) already holds token @ BASE_LR.
    for seed in args.lr_seeds:
        for pooling in ("token", "gap"):
            for lr in LEARNING_RATES:
                key = f"b/{pooling}/lr{lr:g}/seed{seed}"
                if pooling == "token" and lr == BASE_LR and f"a/learned/seed{seed}" in runs:
                    runs[key] = runs[f"a/learned/seed{seed}"]
                    continue
                run(key, dict(pooling=pooling), lr, seed)
    budget["wall_seconds"] = round(time.perf_counter() - started + earlier_seconds, 1)  # all sessions together
    budget["load_average_at_end"] = os.getloadavg()[0]
    write_json(store, dict(budget=budget, runs=runs, inside=inside))
    print(f"all runs in {budget['wall_seconds']:.0f} s")
    return write_outputs(store, args)


def write_outputs(store, args):
    from report_claims import write_report  # beside this script

    with open(store) as f:
        runs = json.load(f)["runs"]
    plot_accuracy(runs, args, os.path.join(args.out, "claims_accuracy.png"))
    write_report(store, os.path.join(args.out, "paper_claims.md"))
    print(f"wrote {store}, {args.out}/claims_accuracy.png and {args.out}/paper_claims.md")
    return 0


def write_json(path, payload):
    temp = path + ".tmp"
    with open(temp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(temp, path)


def plot_accuracy(runs, args, path):
    from vit_keras.visualize import _figure, _save

    figure = _figure(9, 3.4)
    left, middle, right = figure.subplots(1, 3)
    for index, position in enumerate(POSITIONS):
        scores = [runs[f"a/{position}/seed{s}"]["test_accuracy"] for s in args.seeds]
        left.bar(index, np.mean(scores), color="C0", alpha=0.6)
        left.scatter([index] * len(scores), scores, color="k", s=10)
    left.set_xticks(range(len(POSITIONS)), ["none", "1-D", "2-D", "sincos"])
    left.set_title("(a) position embedding")
    left.set_ylabel("test accuracy")
    for pooling in ("token", "gap"):
        means = [np.mean([runs[f"b/{pooling}/lr{lr:g}/seed{s}"]["test_accuracy"] for s in args.lr_seeds])
                 for lr in LEARNING_RATES]
        middle.plot(LEARNING_RATES, means, marker="o", label="class token" if pooling == "token" else "GAP")
    middle.set_xscale("log")
    middle.minorticks_off()
    middle.set_xticks(LEARNING_RATES, labels=[f"{lr:g}" for lr in LEARNING_RATES])
    middle.set_xlabel("peak learning rate")
    middle.set_title("(b) pooling vs learning rate")
    middle.legend()
    for index, key in enumerate(("a/learned", "c/conv_stem")):
        scores = [runs[f"{key}/seed{s}"]["test_accuracy"] for s in args.seeds]
        right.bar(index, np.mean(scores), color="C1", alpha=0.6)
        right.scatter([index] * len(scores), scores, color="k", s=10)
    right.set_xticks([0, 1], ["pure ViT", "conv stem"])
    right.set_title("(c) hybrid at equal compute")
    for axis in (left, right):
        low = min(p.get_height() for p in axis.patches)
        axis.set_ylim(max(0.0, low - 0.08), None)
    figure.tight_layout()
    _save(figure, path)


if __name__ == "__main__":
    sys.exit(main())
