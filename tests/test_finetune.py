"""The fine-tuning recipe: chosen where the weights are pretrained (printed with why), every flag still
overrides it, and its image size is chosen for the machine unless asked for."""

import keras
import pytest

from vit_keras.training import train
from vit_keras.training.config import RECIPES, TrainConfig
from vit_keras.training.finetune import compare_to_estimate, finetune_image_size, with_image_size

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
    big = {cores: finetune_image_size(config, cores=cores, accelerators=0, images=50_000)[0] for cores in (1, 2, 4, 16)}
    assert big == {1: 64, 2: 96, 4: 144, 16: 224}  # never above the preset's own 224
    small = {n: finetune_image_size(config, cores=2, accelerators=0, images=n) for n in (1_000, 10_000)}
    assert small[1_000][0] == 224 and small[10_000][0] == 208  # 300 and 468 steps of 64 images: larger ones fit
    assert "about 13 min for 19,200 training images" in small[1_000][1]
    side, reason = finetune_image_size(config, accelerators=1)
    assert side == 224 and "accelerator" in reason
    base = TrainConfig("fashion_mnist", weights="vit_base_patch32_384.augreg_in21k_ft_in1k")
    assert finetune_image_size(base, cores=1, accelerators=0, images=60_000)[0] == 128  # at least 4x4 patches of 32
    assert with_image_size(TrainConfig("fashion_mnist", weights=TINY, image_size=64)) == (
        TrainConfig("fashion_mnist", weights=TINY, image_size=64), None)
    assert with_image_size(TrainConfig("fashion_mnist"))[0].image_size is None  # from scratch: the recipe's
    chosen, estimate = with_image_size(config)
    assert chosen.image_size % 16 == 0 and "--image-size overrides it" in capsys.readouterr().out
    assert 0 < estimate <= 20 * 60
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
