"""Fine-tuning trials: a pretrained ViT on a folder of photos, one optimizer setting a run.

    python benchmarks/finetune_trials.py --data folder:D --weights W.safetensors --model vit_ti16 \
        --size 96 --optimizer sgd --lr 0.01 --epochs 10

Trains on D's train/ (the weights' head replaced by a zero one) and prints one JSON line: the settings, the
test accuracy on D's test/ and the seconds of fit. The library's own pieces (create_model, the tf.data pipeline,
WarmupCosine) do the work; only the optimizer is chosen here, so settings can be compared before one becomes
the fine-tuning recipe (docs/benchmarks.md, "Fine-tuning a pretrained ViT").
"""

import argparse
import json
import os
import time


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--model", default="vit_ti16")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--epochs", type=float, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup-epochs", type=float, default=0.5)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--augment", default="flip")
    parser.add_argument("--crop-scale", type=float, default=0.35)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main():
    args = parse()
    import keras

    from vit_keras.data.datasets import load_dataset
    from vit_keras.factory import create_model
    from vit_keras.data.pipeline import make_dataset
    from vit_keras.training.train import NO_DECAY_PATTERN, WarmupCosine

    size = (args.size, args.size)
    train = load_dataset(args.data, "train", image_size=size, limit=args.limit, seed=args.seed)
    test = load_dataset(args.data, "test", image_size=size)
    keras.utils.set_random_seed(args.seed)
    model = create_model(args.model, image_size=args.size, num_classes=train.num_classes, weights=args.weights,
                         include_preprocessing=True)
    steps_per_epoch = len(train.labels) // args.batch_size
    total = max(1, round(steps_per_epoch * args.epochs))
    schedule = WarmupCosine(args.lr, total, min(total, int(steps_per_epoch * args.warmup_epochs)))
    if args.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(schedule, momentum=0.9, global_clipnorm=1.0)
    else:
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=args.weight_decay, global_clipnorm=1.0)
        optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    model.compile(optimizer, keras.losses.CategoricalCrossentropy(from_logits=True,
                                                                  label_smoothing=args.label_smoothing),
                  metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")], jit_compile=True,
                  steps_per_execution=4)
    options = dict(num_classes=train.num_classes, image_size=size, channels=3, batch_size=args.batch_size,
                   seed=args.seed)
    batches = make_dataset(train.images, train.labels, training=True, repeat=True, augment=args.augment,
                           crop_scale=(args.crop_scale, 1.0), **options)
    start = time.perf_counter()
    model.fit(batches, epochs=1, steps_per_epoch=total, verbose=0)
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(make_dataset(test.images, test.labels, **options), verbose=0)
    print(json.dumps(dict(vars(args), data=os.path.basename(args.data.rstrip("/")), steps=total,
                          train_images=len(train.labels), test_images=len(test.labels),
                          test_accuracy=round(float(accuracy), 4), fit_seconds=round(seconds, 1),
                          images_per_second=round(total * args.batch_size / seconds, 1))), flush=True)


if __name__ == "__main__":
    main()
