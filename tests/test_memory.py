"""Gradient accumulation sized to the activation budget, and the progress a log shows while an epoch runs."""

import io

import keras
import numpy as np
import pytest

from vit_keras.constants import ACTIVATION_BUDGET
from vit_keras.models.configs import model_config
from vit_keras import ticker
from vit_keras.training import memory, progress, train
from vit_keras.training.config import RECIPES, TrainConfig
from vit_keras.training.plan import FitPlan, parse_every
from vit_keras.training.backup import ResumePoint


def vit(name="vit_ti16", side=224, **changes):
    return {**model_config(name), "image_size": (side, side), **changes}


def test_activations_follow_the_tokens_width_and_depth():
    ti224 = memory.activation_bytes(vit())
    assert 45e6 < ti224 < 55e6  # about 49 MB an image: 197 tokens x 12 blocks (measured ~50-55 MB an image)
    assert memory.activation_bytes(vit(side=96)) < ti224 / 5  # 37 tokens
    assert memory.activation_bytes(vit("vit_b16")) > 3 * ti224  # four times the width
    assert memory.token_count(vit(class_token=False)) == 196
    assert memory.token_count(vit(patch_dropout=0.5)) == 98 + 1  # training keeps half the patches
    assert memory.activation_bytes(vit(patch_dropout=0.5)) < ti224 / 1.9


def test_a_batch_is_accumulated_over_the_fewest_steps_that_fit_the_budget():
    assert memory.accumulation_steps(vit(), 128) == 8  # 16 images a step: about 790 MB
    assert memory.accumulation_steps(vit(), 128, parallel=32) == 4  # none within budget splits over 32: steps of 32
    assert memory.accumulation_steps(vit(side=128), 64) == 1  # about 880 MB: the whole batch
    assert memory.accumulation_steps(vit(side=160), 64) == 2
    small = {**RECIPES["quick"]["model"], "image_size": (32, 32), "patch_size": 8, "num_classes": 10}
    assert memory.accumulation_steps(small, 128) == 1  # the quick recipe: one step a batch
    assert memory.accumulation_steps(vit(), 128, budget=1) == 128  # never below one image a step
    assert memory.accumulation_steps(vit(), 6, parallel=4, budget=1) == 1  # no split fits 4: the whole batch
    assert "8 accumulated steps of 16 images" in memory.describe(vit(), 128, 8)
    assert "one step a batch" in memory.describe(vit(side=32), 8, 1)
    assert ACTIVATION_BUDGET == 1_000_000_000


def test_a_config_accumulates_as_asked_or_as_the_budget_says():
    config = TrainConfig("fashion_mnist", model_name="vit_ti16", image_size=224, batch_size=128)
    assert config.accumulation_of(vit()) == 8 and config.accumulation_of(vit(), parallel=2) == 8
    assert TrainConfig("fashion_mnist", batch_size=128, accumulate=4).accumulation_of(vit()) == 4
    with pytest.raises(ValueError, match="steps of 32 images, which do not split over 3 devices"):
        TrainConfig("fashion_mnist", batch_size=128, accumulate=4).accumulation_of(vit(), parallel=3)


def test_a_plan_runs_a_resumed_epoch_on_its_own_then_the_rest():
    plan = FitPlan(steps=10, accumulation=4)
    assert plan.fit_steps == 40 and plan.fixed_steps(False) and not FitPlan(10).fixed_steps(False)
    assert plan.phases(ResumePoint(), 3) == [(0, 3, 0)]
    assert plan.phases(ResumePoint(1, 0, "p"), 3) == [(1, 3, 0)]
    assert plan.phases(ResumePoint(1, 8, "p"), 3) == [(1, 2, 8), (2, 3, 0)]
    assert plan.phases(ResumePoint(2, 8, "p"), 3) == [(2, 3, 8)]
    assert plan.phases(ResumePoint(3, 0, "p"), 3) == []
    assert parse_every("auto") == (None, 600.0) and parse_every("epoch") == (None, None)
    assert parse_every(25) == (25, None) and parse_every("2.5min") == (None, 150.0)
    for bad in (0, True, "0min", "often", 1.5):
        with pytest.raises(ValueError, match="`backup_every` must be 'auto'"):
            parse_every(bad)


def test_accumulated_steps_make_the_same_updates_as_whole_batches(tmp_path):
    """For a model without batch statistics (the plain patch embedding, not the conv stem's BatchNorm), over an
    epoch: warm-up, then cosine decay, counted in updates (a second epoch would draw its order afresh)."""
    kw = dict(limit=256, batch_size=64, epochs=1, augment="none", jit_compile=False, verbose=0, tensorboard=False,
              distill="none", model_overrides=dict(hidden_size=32, num_heads=2, mlp_dim=64, num_layers=1, stem=None))
    weights = []
    for steps in (1, 4):
        record = train.train("fashion_mnist", str(tmp_path / str(steps)), accumulate=steps, **kw)
        assert record["accumulation"] == steps and record["steps_per_epoch"] == 4
        model = keras.saving.load_model(tmp_path / str(steps) / "model.keras", compile=False)
        weights.append(model.get_weights())
    assert max(float(np.abs(a - b).max()) for a, b in zip(*weights)) < 2e-5


def test_the_schedule_counts_updates_under_accumulation():
    whole = train.WarmupCosine(1.0, 10, 4)
    parts = train.WarmupCosine(1.0, 10, 4, steps_per_update=3)
    for update in range(10):  # the optimizer reads the schedule at the last step of each accumulated update
        assert float(parts(3 * update + 2)) == pytest.approx(float(whole(update)))
    assert parts.get_config()["steps_per_update"] == 3


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_log_gets_the_first_step_then_a_line_every_interval(monkeypatch):
    clock, lines = Clock(), []
    monkeypatch.setattr(progress.time, "monotonic", clock)
    log = progress.ProgressLog(8, steps=100, epochs=2, start_epoch=0, start_step=20, interval=30,
                               print_fn=lambda line, flush: lines.append(line))
    log.on_epoch_begin(0)
    clock.now += 40
    log.on_train_batch_end(0, {"loss": 2.5})  # compiling took most of it
    clock.now += 10
    log.on_train_batch_end(9, {"loss": 2.0})  # within the interval: nothing
    clock.now += 20
    log.on_train_batch_end(19, {"loss": 1.5})
    assert lines == ["epoch 1/2: 168 of 800 images (21%), first step after 40s, loss 2.5000",
                     "epoch 1/2: 320 of 800 images (40%), 5.1 img/s, loss 1.5000, 1m10s elapsed, about 1m35s left"]
    log.on_epoch_begin(1)  # the next epoch starts at its first step: quick, and not said again
    clock.now += 5
    log.on_train_batch_end(0)
    clock.now += 30
    log.on_train_batch_end(9)
    assert lines[2:] == ["epoch 2/2: 80 of 800 images (10%), 2.4 img/s, 35s elapsed, about 5m00s left"]
    assert progress.fit_verbosity("auto", io.StringIO()) == 2 and ticker.duration(3725) == "1h02m"


def test_a_long_loop_prints_a_line_every_interval_and_a_short_one_none(monkeypatch):
    clock, lines = Clock(), []
    monkeypatch.setattr(ticker.time, "monotonic", clock)
    loop = ticker.Ticker("evaluate", 1000, interval=30, print_fn=lambda line, flush: lines.append(line))
    clock.now += 10
    loop.update(100)
    assert lines == []  # a loop shorter than the interval stays quiet
    clock.now += 30
    loop.update(300)
    assert lines == ["evaluate: 400 of 1,000 images, 10.0 img/s, 40s elapsed, about 1m00s left"]
