"""The fine-tuning recipe: chosen where the weights are pretrained (printed with why), every flag still
overrides it, and its image size (and epochs, where left to it) is chosen for the machine unless asked for."""

import keras
import pytest
import tensorflow as tf

from vit_keras.training import train, warmup
from vit_keras.training.config import RECIPES, TrainConfig
from vit_keras.training.finetune import (StepTimes, choose_image_size, compare_to_estimate, cost, finetune_image_size,
                                         with_image_size)

TINY = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def test_pretrained_weights_choose_the_finetune_recipe_and_flags_override_it(tmp_path):
    tuned = TrainConfig("fashion_mnist", weights=TINY)
    recipe = RECIPES["finetune"]
    assert (tuned.recipe, tuned.optimizer, tuned.epochs, tuned.label_smoothing) == \
        ("finetune", recipe["optimizer"], recipe["epochs"], recipe["label_smoothing"])
    assert tuned.learning_rate == pytest.approx(recipe["base_lr"] * recipe["batch_size"] / 512)
    own = TrainConfig("fashion_mnist", weights=TINY, optimizer="adamw", learning_rate=3e-4, label_smoothing=0.1)
    assert (own.optimizer, own.learning_rate, own.label_smoothing) == ("adamw", 3e-4, 0.1)
    scratch = TrainConfig("fashion_mnist", weights=TINY, recipe="quick")  # asked for: kept, and said so
    assert scratch.recipe == "quick" and "asked for" in scratch.recipe_reason()
    assert TrainConfig("fashion_mnist", weights=str(tmp_path / "m.keras")).recipe == "finetune"
    assert TrainConfig("fashion_mnist").recipe == "quick"
    with pytest.raises(ValueError, match="`recipe`='finetune' fine-tunes pretrained weights: pass `weights`"):
        TrainConfig("fashion_mnist", recipe="finetune")
    with pytest.raises(ValueError, match="`optimizer`"):
        TrainConfig("fashion_mnist", optimizer="lion")


def test_the_image_size_is_chosen_for_the_data_and_the_machine_and_an_asked_one_is_kept(capsys):
    config = TrainConfig("fashion_mnist", weights=TINY)
    # The epochs left to the recipe: the largest size at which one epoch fits, then as many of its 3 as fit there.
    big = {cores: choose_image_size(config, cores=cores, accelerators=0, images=50_000) for cores in (1, 2, 4, 16)}
    assert {cores: (choice.side, choice.epochs) for cores, choice in big.items()} == {
        1: (112, 1), 2: (160, 1), 4: (224, 1), 16: (224, 3)}  # never above the preset's own 224
    assert "the largest at which 1 epoch(s) fit 20 min on 2 CPU core(s), and the most epochs of the recipe's 3" in (
        big[2].reason)
    asked = TrainConfig("fashion_mnist", weights=TINY, epochs=3)  # epochs asked for: only the size is chosen
    choice = choose_image_size(asked, cores=2, accelerators=0, images=50_000)
    assert (choice.side, choice.epochs) == (96, 3) and "the 3 epoch(s) asked for" in choice.reason
    small = {n: choose_image_size(config, cores=2, accelerators=0, images=n) for n in (1_000, 10_000)}
    assert (small[1_000].side, small[1_000].epochs) == (224, 3)  # 300 steps of 64 images however many epochs
    assert (small[10_000].side, small[10_000].epochs) == (224, 2)  # 2 epochs of 156 steps fit, not 3
    assert "about 13 min for 19,200 training images" in small[1_000].reason
    side, reason = finetune_image_size(config, accelerators=1)
    assert side == 224 and "accelerator" in reason
    base = TrainConfig("fashion_mnist", weights="vit_base_patch32_384.augreg_in21k_ft_in1k")
    assert finetune_image_size(base, cores=1, accelerators=0, images=60_000)[0] == 128  # at least 4x4 patches of 32
    assert with_image_size(TrainConfig("fashion_mnist", weights=TINY, image_size=64)) == (
        TrainConfig("fashion_mnist", weights=TINY, image_size=64), None)
    assert with_image_size(TrainConfig("fashion_mnist"))[0].image_size is None  # from scratch: the recipe's
    chosen, estimate = with_image_size(config)
    assert chosen.image_size % 16 == 0 and "--image-size and --epochs override them" in capsys.readouterr().out
    assert 0 < estimate <= 20 * 60 and chosen.from_recipe == config.from_recipe
    assert compare_to_estimate(1380, 1020) == ("fit: 23.0 min, against the 17.0 min estimated when the image size "
                                               "was chosen (+35%)")


def test_sgd_is_the_papers_fine_tuning_optimizer():
    sgd = train.make_optimizer(1e-2, weight_decay=0.0, name="sgd")
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.9 and sgd.global_clipnorm == 1.0
    assert isinstance(train.make_optimizer(1e-3), keras.optimizers.AdamW)
    with pytest.raises(ValueError, match="`optimizer`"):
        train.make_optimizer(1e-3, name="adam")


def test_a_saved_model_fine_tunes_at_most_at_its_own_size(tmp_path):
    saved = train.build_model_to_train(10, 1, (28, 28))  # the quick recipe's ViT: 32 px, patch 8
    saved.save(tmp_path / "base.keras")
    config = TrainConfig("fashion_mnist", weights=str(tmp_path / "base.keras"))
    side, reason = finetune_image_size(config, cores=2, accelerators=0, images=60_000)
    assert side == 32 and "the saved model's size" in reason


def test_a_measured_warm_up_picks_the_size_and_is_measured_again_where_it_moves_the_choice(capsys):
    config = TrainConfig("fashion_mnist", weights=TINY)  # 3 epochs of 50,000 images, 10,000 validated an epoch
    shape = (16, 192, 12)

    def machine(rate_at_96):  # a machine whose ViT-Ti/16 trains rate_at_96 img/s at 96 px (and validates 4x that)
        def measure(side):
            measured.append(side)
            scale = cost(side, *shape) / cost(96, *shape)
            return StepTimes(side, scale / rate_at_96, scale / rate_at_96 / 4, compile=20.0, measured_in=15.0)
        measured = []
        return measure, measured

    as_table, measured = machine(145)  # the table's rate: its choice (160 for one epoch) holds, measured once
    choice = choose_image_size(config, cores=2, accelerators=0, images=50_000, measure=as_table)
    assert (choice.side, choice.epochs, measured) == (160, 1, [160]) and "measured by a 15 s warm-up" in choice.reason
    scale = cost(160, *shape) / cost(96, *shape)
    trained, validated = 50_000 // 64 * 64, 10_000
    assert choice.seconds == pytest.approx(trained * scale / 145 + validated * scale / 580 + 20)
    slower, measured = machine(100)  # a third slower than the table: smaller, measured there too
    choice = choose_image_size(config, cores=2, accelerators=0, images=50_000, measure=slower)
    assert (choice.side, choice.epochs, measured) == (128, 1, [160, 128]) and choice.seconds <= 20 * 60
    assert "measured by a 30 s warm-up" in choice.reason
    faster, measured = machine(800)  # 224 px, the preset's own, fits 2 epochs: the most of 3 that fit
    choice = choose_image_size(config, cores=2, accelerators=0, images=50_000, measure=faster)
    assert (choice.side, choice.epochs) == (224, 2)
    chosen, _ = with_image_size(config, slower)
    # A recipe warm-up of half an epoch in 3 keeps its share in 1; the chosen settings stay the recipe's.
    assert (chosen.image_size, chosen.epochs, chosen.warmup_epochs) == (128, 1, pytest.approx(0.5 / 3))
    assert chosen.from_recipe == config.from_recipe and chosen.augmentation(50_000) == "flip"  # one pass
    assert config.augmentation(50_000) == "crop"  # 3 epochs: the recipe's crops
    resumed = with_image_size(config, slower, recorded=dict(image_size=112, epochs=1, warmup_epochs=0.25))
    assert resumed == (config.chosen(image_size=112, epochs=1, warmup_epochs=0.25), None)
    assert "112, epochs: 1, as the run being resumed chose" in capsys.readouterr().out
    asked = TrainConfig("fashion_mnist", weights=TINY, epochs=2)  # asked epochs are kept on resuming
    assert with_image_size(asked, slower, recorded=dict(image_size=112, epochs=1))[0].epochs == 2


def test_patch_dropout_buys_a_larger_image_in_the_same_minutes():
    """Training on half the patches costs about half a step (the cost model counts the kept tokens; validation
    sees them all), so the same 20 minutes fine-tune at a larger size. The recipes train on every token."""
    shape = (16, 192, 12)
    assert cost(96, *shape, 0.5) / cost(96, *shape) == pytest.approx(19 / 37, rel=0.02)  # 18 of 36 patches + 1
    sides = {rate: finetune_image_size(TrainConfig("fashion_mnist", weights=TINY, epochs=3, patch_dropout=rate),
                                       cores=2, accelerators=0, images=50_000)[0] for rate in (0.0, 0.5)}
    assert sides[0.0] == 96 and sides[0.5] > 112
    assert TrainConfig("fashion_mnist", weights=TINY).patch_dropout == TrainConfig("fashion_mnist").patch_dropout == 0
    times = StepTimes(96, train=0.01, evaluate=0.002, compile=0.0).at(128, shape, patch_dropout=0.5)
    assert times.train == pytest.approx(0.01 * cost(128, *shape, 0.5) / cost(96, *shape, 0.5))
    assert times.evaluate == pytest.approx(0.002 * cost(128, *shape) / cost(96, *shape))
    with pytest.raises(ValueError, match="`patch_dropout` must be in \\[0, 1\\)"):
        TrainConfig("fashion_mnist", weights=TINY, patch_dropout=1.0)


def test_the_warm_up_times_the_runs_own_model_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "TRAIN_SECONDS", 1.0)
    monkeypatch.setattr(warmup, "EVALUATE_SECONDS", 0.5)
    saved = train.build_model_to_train(10, 3, (32, 32), image_size=32,
                                       model_overrides=dict(patch_size=4, num_layers=2, stem=None))
    saved.save(tmp_path / "base.keras")
    config = TrainConfig("fashion_mnist", weights=str(tmp_path / "base.keras"), batch_size=16, epochs=1)
    times = warmup.step_times(config, 16)
    assert times.side == 16 and 0 < times.evaluate < times.train and times.compile > 0
    assert times.measured_in >= 1.5  # the steps it timed, at least
    # Fed as the fit's data is: tf.data under TensorFlow (a PyDataset timed its steps a quarter slower).
    batches = warmup.repeated_batch(4, 16, 3, steps=5)
    assert isinstance(batches, tf.data.Dataset) and int(batches.cardinality()) == 5
    images, labels = next(iter(batches))
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4, warmup.WARMUP_CLASSES)


def test_missing_weights_fail_before_the_data_is_read_or_a_warm_up_runs(tmp_path, capsys):
    with pytest.raises((OSError, ValueError), match="missing.safetensors"):
        train.train("fashion_mnist", str(tmp_path / "run"), weights=str(tmp_path / "missing.safetensors"),
                    model_name="vit_ti16")
    printed = capsys.readouterr().out
    assert "recipe: finetune" in printed and "input:" not in printed and "image size:" not in printed
