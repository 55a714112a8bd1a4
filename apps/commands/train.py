"""`vit-keras train`: train a ViT on Fashion-MNIST, a tfds dataset or a folder of images; rerun to resume.

With --export (and --web) it then ships the run: the .tflite files, their verify report and the browser site
(apps/ship.py), skipping on a rerun what is up to date.
"""

import argparse
import os

HELP = "Train a ViT with model.fit (the paper's recipe); rerunning the same command resumes an interrupted run."

from vit_keras.apps.commands import DATA_DIR_HELP, add_input_arguments
from vit_keras.constants import (ACTIVATION_BUDGET, AUGMENTATIONS, BACKUP_MINUTES, BACKEND_STRATEGIES, BOUNDS,
                                 DISTILLATIONS, MICRO_BATCHES, OPTIMIZERS,
                                 NPU_MODE, POOLINGS, PRECISIONS, RECIPE_MODEL, RECIPE_TABLES, RECIPES, SHIP_MODES,
                                 STEPS_PER_EXECUTION, STRATEGIES, VAL_FRACTION, BASE_BATCH_SIZE)

FLAGS = {"learning_rate": "lr"}  # a TrainConfig setting -> its flag, where the names differ
OVERRIDES = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim")  # positive ints


def shown(value):
    """A recipe value as the help states it: 0.05, 20, adamw; a crop scale's (min, max) as its min."""
    if isinstance(value, tuple):
        value = value[0]
    return f"{value:g}" if isinstance(value, float) else str(value)


def recipe_values(setting, value=None):
    """The recipes' values of ``setting`` in words, e.g. "20 quick, 90 long, 3 finetune", or "0.5 in each";
    ``value(recipe)`` computes them instead (default: the setting's value)."""
    values = [shown(value(RECIPE_TABLES[recipe]) if value else RECIPE_TABLES[recipe][setting])
              for recipe in RECIPES]
    if len(set(values)) == 1:
        return f"{values[0]} in each"
    return ", ".join(f"{text} {recipe}" for text, recipe in zip(values, RECIPES))


def recipe_default(setting):
    """"default: the recipe's: 20 quick, 90 long, 3 finetune" for ``setting``."""
    return f"default: the recipe's: {recipe_values(setting)}"


def add_arguments(parser):
    parser.add_argument("--data", default="fashion_mnist",
                        help="fashion_mnist | tfds:NAME | folder:PATH (one sub-folder per class) | shards:PATH (written "
                             "by `vit-keras prepare`). Default: fashion_mnist")
    add_input_arguments(parser)
    parser.add_argument("--out", required=True, help="run directory: model.keras, labels.txt, history.csv, config.json")
    parser.add_argument("--model", default=None,
                        help="a model name (vit_ti16, vit_s16, ...); default: the recipe's small ViT for the data's size")
    parser.add_argument("--image-size", type=int, default=None,
                        help="input size (default: from the data; when fine-tuning, the largest the machine trains "
                             "fast, printed with why)")
    parser.add_argument("--patch-size", type=int, default=None, help="override the model's patch size (default: "
                                                                     "the model's own)")
    parser.add_argument("--hidden-size", type=int, default=None, help="override the model's width (default: the "
                                                                      "model's own)")
    parser.add_argument("--num-layers", type=int, default=None, help="override the model's depth (default: the "
                                                                     "model's own)")
    parser.add_argument("--num-heads", type=int, default=None, help="override the model's head count (default: the "
                                                                    "model's own)")
    parser.add_argument("--mlp-dim", type=int, default=None, help="override the model's MLP width (default: the "
                                                                  "model's own)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="eq. 4's readout: class token, GAP, or CCT's sequence pooling (default: the model's own: "
                             f"{RECIPE_MODEL['pooling']} for the recipes' small ViT)")
    parser.add_argument("--locality-attention", action="store_true",
                        help="Locality Self-Attention in every block (diagonal masked, learned temperature)")
    parser.add_argument("--recipe", choices=RECIPES, default=None,
                        help="hyper-parameter defaults: quick, long (from scratch) or finetune (pretrained weights; "
                             "it also picks the image size for the machine). Default: finetune with --weights, "
                             "else quick; the run prints which and why")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"passes over the training data ({recipe_default('epochs')}; on CPUs a fine-tune "
                             "with no --image-size takes fewer, down to 1, where that buys a larger size, printed "
                             "with why)")
    parser.add_argument("--min-steps", type=int, default=None, metavar="N",
                        help="the fewest optimizer steps: on small data each epoch repeats the images until the run "
                             "has N steps (default: the recipe's floor when --epochs is unset: "
                             f"{recipe_values('min_steps')}; else 0)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"global batch size, split over replicas ({recipe_default('batch_size')})")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                        help="adamw, or sgd: SGD with momentum 0.9, the paper's fine-tuning "
                             f"({recipe_default('optimizer')})")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"peak learning rate (default: the recipe's base LR * batch size / {BASE_BATCH_SIZE}, "
                             "which at the recipe's own batch size is "
                             + recipe_values("lr", lambda r: r["base_lr"] * r["batch_size"] / BASE_BATCH_SIZE) + ")")
    parser.add_argument("--weight-decay", type=float, default=None,
                        help=f"decoupled weight decay ({recipe_default('weight_decay')})")
    parser.add_argument("--label-smoothing", type=float, default=None,
                        help=f"label smoothing of the loss, 0-1 ({recipe_default('label_smoothing')})")
    parser.add_argument("--drop-path", type=float, default=None,
                        help="stochastic depth: the drop-path rate of the last block, rising linearly from 0 at the "
                             f"first ({recipe_default('drop_path')}; a .keras model given to --weights keeps its "
                             "own)")
    parser.add_argument("--patch-dropout", type=float, default=None,
                        help="share of patch tokens each training image drops, 0-1 (PatchDropout: a step costs about "
                             "that much less, so a fine-tune on CPUs picks a larger image; validation and the "
                             f"saved model see every token) ({recipe_default('patch_dropout')})")
    parser.add_argument("--warmup-epochs", type=float, default=None,
                        help="epochs of linear learning-rate warm-up before the cosine decay "
                             f"({recipe_default('warmup_epochs')})")
    parser.add_argument("--augment", choices=AUGMENTATIONS, default=None,
                        help=f"augmentation ({recipe_default('augment')}; on small data, where the step floor "
                             f"repeats the images, {recipe_values('small_data_augment')}; in a single pass over the data, "
                             f"{recipe_values('single_pass_augment')}; flips are turned off where "
                             "a nearest-neighbour check of the training data finds that they change labels, as on "
                             "digits or text)")
    parser.add_argument("--crop-scale", type=float, default=None, metavar="MIN",
                        help="smallest area fraction kept by --augment crop / randaugment, 0 < MIN <= 1 "
                             f"({recipe_default('crop_scale')})")
    parser.add_argument("--mixup", type=float, default=None, help=f"MixUp alpha, 0: off ({recipe_default('mixup')})")
    parser.add_argument("--cutmix", type=float, default=None,
                        help=f"CutMix factor, 0: off ({recipe_default('cutmix')})")
    parser.add_argument("--erase", type=float, default=None, metavar="P",
                        help="random erasing: the probability that a training image has a rectangle replaced by noise "
                             f"({recipe_default('erase')}; on small data up to {recipe_values('small_data_erase')}, "
                             "by the passes the run makes over them)")
    parser.add_argument("--distill", choices=DISTILLATIONS, default="auto",
                        help="learn from a small CNN's labels too, the CNN trained first (DeiT's hard distillation); "
                             "auto (default): where the recipe's ViT trains on small data")
    parser.add_argument("--teacher-steps", type=int, default=None, metavar="N",
                        help=f"the CNN teacher's training steps ({recipe_default('teacher_steps')})")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="float32, or Keras mixed precision: float16 or bfloat16 compute with float32 weights "
                             "(default: %(default)s)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto",
                        help="devices: " + "; ".join(f"KERAS_BACKEND={backend}: {', '.join(names)}"
                                                     for backend, names in BACKEND_STRATEGIES.items())
                             + " (default: %(default)s: a TPU, or every GPU where there are several, else one "
                               "device)")
    parser.add_argument("--weights", default=None,
                        help="start from these weights: a preset (`vit-keras presets` lists them; it brings its "
                             "model), a .keras model (fine-tune; new head if the classes differ) or a checkpoint "
                             "that `create_model(weights=...)` reads")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION,
                        help="held-out fraction of a folder dataset without val/ or test/ folders "
                             "(default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use a seeded, class-balanced sample of N examples of each split (it prints how many "
                             "of each class; default: all of them)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the run's random seed: the weights' initialization, a folder's held-out split, "
                             "--limit's sample, the data order and augmentation (default: %(default)s)")
    parser.add_argument("--backup-every", type=backup_interval, default="auto", metavar="N|Mmin|epoch",
                        help="besides each epoch's end, back up for resumption every N steps, every M minutes of "
                             f"training ('5min'), or only at epoch ends ('epoch') (default: %(default)s, every "
                             f"{BACKUP_MINUTES:g} minutes)")
    parser.add_argument("--accumulate", type=int, default=None, metavar="N",
                        help="compute each batch as N accumulated steps of batch/N images (the same update, 1/N "
                             "of the memory); default: the fewest whose activations stay within "
                             f"{ACTIVATION_BUDGET / 1e6:.0f} MB a step")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in --out when it holds a run with other settings (its model, history "
                             "and backups are deleted); without it such a rerun is refused")
    parser.add_argument("--steps-per-execution", type=int, default=None,
                        help=f"training steps per call into TensorFlow (fewer Python round trips; default {STEPS_PER_EXECUTION})")
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="split each batch into N micro-batches whose XLA programs run concurrently "
                             f"(keeps a small CPU's cores busy; default {MICRO_BATCHES}, 1: one program per step)")
    parser.add_argument("--no-jit", action="store_true", help="run without XLA (jit_compile=False)")
    parser.add_argument("--quiet", action="store_true", help="one line per epoch instead of a progress bar")
    parser.add_argument("--export", default=None, metavar="MODE[,MODE...]",
                        help="after training, write DIR/model_<MODE>.tflite with metadata for each of "
                             f"{', '.join(SHIP_MODES)} (int8 and npu, the full-integer file for phone NPUs, "
                             "calibrate on the run's training images) and "
                             "DIR/verify.md, their check against model.keras on the held-out images; a rerun "
                             "keeps the files that are up to date")
    parser.add_argument("--web", action="store_true",
                        help="with --export: also DIR/web/, the static browser site of the int8 file (else of the "
                             "first mode)")


def backup_interval(text):
    """--backup-every: "auto", "epoch", N steps or "<M>min", checked as TrainConfig checks it."""
    from vit_keras.training.plan import parse_every

    value = int(text) if text.isdigit() else text
    try:
        parse_every(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).replace("`backup_every`", "--backup-every")) from None
    return value


def check_args(args):
    """Early, clear errors for values argparse cannot check (the Keras backend's among them)."""
    from vit_keras.training.backends import check_backend, check_strategy

    check_strategy(args.strategy, check_backend(), name="--strategy")
    for name in ("epochs", "batch_size", "image_size", "limit", "steps_per_execution", "accumulate",
                 "micro_batches", "teacher_steps", *OVERRIDES):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer; got {value}.")
    if args.min_steps is not None and args.min_steps < 0:
        raise ValueError(f"--min-steps must be an integer >= 0; got {args.min_steps}.")
    for name, valid, bounds in BOUNDS:  # TrainConfig's own, checked before anything heavy loads
        flag = FLAGS.get(name, name)
        value = getattr(args, flag, None)
        if value is not None and not valid(value):
            raise ValueError(f"--{flag.replace('_', '-')} must be {bounds}; got {value}.")
    if args.crop_scale is not None and not 0 < args.crop_scale <= 1:
        raise ValueError(f"--crop-scale must be in (0, 1]; got {args.crop_scale}.")
    if not (args.data == "fashion_mnist" or args.data.startswith(("tfds:", "folder:", "shards:"))):
        raise ValueError(f"--data must be fashion_mnist, tfds:NAME, folder:PATH or shards:PATH; got {args.data!r}.")
    if args.data.startswith("folder:") and not os.path.isdir(args.data[7:]):
        raise FileNotFoundError(f"--data folder {args.data[7:]!r} does not exist.")
    if args.weights and not args.weights.startswith(("http://", "https://", "gs://")) \
            and not os.path.exists(args.weights):
        from vit_keras.weights.presets import is_preset, nearest_presets

        if not is_preset(args.weights):
            near = nearest_presets(args.weights)
            raise FileNotFoundError(f"--weights {args.weights!r} does not exist, and is no preset"
                                    + (f"; the nearest presets: {', '.join(near)}." if near else "."))
    if args.model is not None:
        from vit_keras.models.configs import MODELS

        if args.model not in MODELS:
            raise ValueError(f"--model {args.model!r} is unknown; valid names are {', '.join(sorted(MODELS))}.")
    check_export_args(args)


def check_export_args(args):
    """--export and --web, checked before any data loads: a bad mode or a missing web runtime fails at once."""
    if args.web and not args.export:
        raise ValueError("--web needs --export MODE (the site runs an exported .tflite), e.g. --export int8 --web.")
    if not args.export:
        return
    from vit_keras.apps.ship import parse_modes, site_mode

    modes = parse_modes(args.export, name="--export")
    if args.web:
        site_mode(modes)  # a mode a browser runs
    calibrated = [mode for mode in modes if mode in ("int8", NPU_MODE)]
    if calibrated and args.limit is not None:
        from vit_keras.constants import MIN_CALIBRATION_IMAGES

        if args.limit < MIN_CALIBRATION_IMAGES:
            raise ValueError(f"--export {calibrated[0]} calibrates on at least {MIN_CALIBRATION_IMAGES} training "
                             "images, but "
                             f"--limit {args.limit} keeps fewer; raise --limit or export a float mode.")
    if args.web:
        from vit_keras.apps.web_export import check_web_runtime

        check_web_runtime()


def run(args):
    check_args(args)
    from vit_keras.training import train

    try:
        config = train.train(
            args.data, args.out, model_name=args.model, image_size=args.image_size, recipe=args.recipe,
            epochs=args.epochs, min_steps=args.min_steps, batch_size=args.batch_size, optimizer=args.optimizer,
            learning_rate=args.lr, weight_decay=args.weight_decay,
            label_smoothing=args.label_smoothing, drop_path=args.drop_path, patch_dropout=args.patch_dropout,
            augment=args.augment,
            crop_scale=None if args.crop_scale is None else (args.crop_scale, 1.0), mixup=args.mixup,
            cutmix=args.cutmix, erase=args.erase, warmup_epochs=args.warmup_epochs, distill=args.distill,
            teacher_steps=args.teacher_steps, precision=args.precision, strategy=args.strategy,
            weights=args.weights, seed=args.seed, limit=args.limit, data_dir=args.data_dir,
            val_fraction=args.val_fraction, backup_every=args.backup_every, jit_compile=not args.no_jit,
            accumulate=args.accumulate or "auto", overwrite=args.overwrite,
            input_mode=args.input_mode,
            verbose=2 if args.quiet else "auto",
            model_overrides={**{k: getattr(args, k) for k in (*OVERRIDES, "pooling") if getattr(args, k) is not None},
                             **({"locality_attention": True} if args.locality_attention else {})},
            **{k: getattr(args, k) for k in ("steps_per_execution", "micro_batches") if getattr(args, k) is not None},
        )
    except train.NonFiniteLoss as error:
        print(f"vit-keras train: stopped: {error}")
        return 1
    accuracy = config.get("final_val_accuracy")
    summary = f"val accuracy {accuracy:.4f}" if accuracy is not None else "done"
    print(f"Trained {config['model']} for {config['epochs']} epochs: {summary}. Model: "
          f"{os.path.join(args.out, 'model.keras')}")
    if args.export:
        from vit_keras.apps.ship import ship_run

        ship_run(args.out, args.export, web=args.web, data_dir=args.data_dir)
    return 0
