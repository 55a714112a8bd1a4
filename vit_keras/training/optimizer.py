"""The recipe's optimizer and learning-rate schedule, and compiling a model with them.

AdamW (no weight decay on norms, biases, position embedding, cls token) or SGD with momentum 0.9, global-norm
clipping, a linear warm-up then cosine decay counted in updates (``WarmupCosine``), label-smoothed cross-entropy.
"""

import math

import keras

from vit_keras.constants import OPTIMIZERS, PRECISIONS
from vit_keras.framework import tracing_graph
from vit_keras.models.layers import register
from vit_keras.validation import check_choice

# Variable names (``variable.name``) kept out of weight decay: LayerNorm/BatchNorm scale and offset,
# all biases, the position embeddings and the class token.
NO_DECAY_PATTERN = r"^(gamma|beta|bias|pos_embedding|pos_row|pos_col|pos_cls|cls|logit_scale)$"


@register
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then cosine decay to ``end`` at ``total_steps``,
    counted in updates: with ``steps_per_update`` > 1 (gradient accumulation) the optimizer's step count, which
    counts every accumulated step, is divided by it."""

    def __init__(self, peak, total_steps, warmup_steps=0, end=0.0, steps_per_update=1):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"Need 0 <= warmup_steps <= total_steps and total_steps >= 1; "
                             f"got warmup_steps={warmup_steps}, total_steps={total_steps}.")
        self.peak, self.end = float(peak), float(end)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.steps_per_update = int(steps_per_update)
        self._traced = (None, None, None)  # (graph, step, rate): the rate of the step being traced

    def __call__(self, step):
        # Keras's optimizers read the learning rate once a variable, so a traced TensorFlow step held ~150 copies
        # of this formula, a third of ViT-Ti's train-step ops (docs/training.md#the-first-step): one a trace is kept.
        graph = tracing_graph()
        traced_graph, traced_step, traced_rate = self._traced  # one read: another thread may trace meanwhile
        if graph is not None and traced_graph is graph and traced_step is step:
            return traced_rate
        rate = self.rate_at(step)
        self._traced = (graph, step, rate) if graph is not None else (None, None, None)
        return rate

    def rate_at(self, step):
        ops = keras.ops
        step = ops.floor(ops.cast(step, "float32") / self.steps_per_update)
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        cosine = self.end + 0.5 * (self.peak - self.end) * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, warmup, cosine)

    def get_config(self):
        return dict(peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps, end=self.end,
                    steps_per_update=self.steps_per_update)


def make_optimizer(schedule, weight_decay=0.05, clipnorm=1.0, precision="float32", beta_2=0.999, name="adamw",
                   accumulation=1):
    """AdamW, or SGD with momentum 0.9 (``name``="sgd", the paper's fine-tuning), with the no-decay exclusions and
    global-norm clipping (loss-scaled under float16); ``accumulation`` > 1 averages that many steps' gradients
    into each update (``schedule`` then counts steps, not updates)."""
    check_choice(name, "optimizer", OPTIMIZERS)
    common = dict(learning_rate=schedule, weight_decay=weight_decay, global_clipnorm=clipnorm,
                  gradient_accumulation_steps=accumulation if accumulation > 1 else None)
    if name == "sgd":
        optimizer = keras.optimizers.SGD(momentum=0.9, **common)
    else:
        optimizer = keras.optimizers.AdamW(beta_1=0.9, beta_2=beta_2, **common)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def fast_precision(precision, cpu, accelerators):
    """(``precision``, None), or ("float32", why) where that mixed precision would train slower than float32: on a
    machine without GPUs or TPUs, mixed_bfloat16 needs the CPU's bfloat16 units (``cpu``: a ``CpuFeatures``);
    without them every bf16 matmul runs in software."""
    if precision == "mixed_bfloat16" and not accelerators and not cpu.bf16:
        return "float32", f"this CPU ({cpu.describe()}) has no bfloat16 units (AVX512_BF16 or AMX-BF16)"
    return precision, None


def set_precision(precision):
    """Set the global Keras dtype policy; call before building the model."""
    check_choice(precision, "precision", PRECISIONS)
    keras.mixed_precision.set_global_policy(precision)


def compile_model(model, schedule, precision="float32", weight_decay=0.05, label_smoothing=0.1, clipnorm=1.0,
                  jit_compile="auto", steps_per_execution=1, optimizer="adamw", accumulation=1):
    """Compile with the recipe's optimizer and a label-smoothed loss on one-hot labels."""
    model.compile(
        optimizer=make_optimizer(schedule, weight_decay, clipnorm, precision, name=optimizer,
                                 accumulation=accumulation),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model
