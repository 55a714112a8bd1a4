"""Inference in bfloat16 or int8 where this CPU has the units for them, checked against float32.

    predict(model, images, precision="bfloat16")  # AVX512_BF16 / AMX: TensorFlow's oneDNN bf16 kernels
    predict(model, images, precision="int8")      # Keras's int8 Dense (weights per channel, inputs per token), XLA

A lower precision runs a twin of the model (``twin``): the same weights rebuilt in bfloat16 (logits stay
float32), or with every Dense layer quantized by Keras's ``model.quantize("int8")``; one twin per model and
precision, kept while the model lives. ``resolve`` picks the compiler each needs and refuses, with a warning and
float32, a precision this CPU or backend has no fast kernels for (where the backend computes on the CPU):
software bfloat16 is several times slower than float32, and TensorFlow's graph kernels for Keras's int8 matmul
twenty times slower (docs/benchmarks.md).
"""

import dataclasses
import warnings
import weakref

import keras
import numpy as np

from vit_keras.constants import INFERENCE_PRECISIONS
from vit_keras.cpu import cpu_features
from vit_keras.devices import accelerator_count
from vit_keras.validation import check_choice

AGREEMENT_FLOOR = 0.995  # least top-1 agreement with float32 a lower precision must keep on the user's images
CHECK_IMAGES = 256  # images a lower precision is checked on (also run in float32) before it runs alone
# Under TensorFlow: XLA's CPU dot does not reach the bf16 units (TensorFlow's own kernel does), while Keras's
# int8 matmul is fast only compiled by XLA. float32 keeps the caller's choice.
JIT_FOR = {"bfloat16": False, "int8": True}
TWINS = weakref.WeakKeyDictionary()  # model -> {precision: its twin}
AGREEMENTS = weakref.WeakKeyDictionary()  # model -> {precision: its Agreement with float32}


def resolve(precision, jit_compile=True, cpu=None):
    """(precision, jit_compile) to run: ``precision`` where this CPU and backend compute it fast, else float32 with
    a warning that says why."""
    check_choice(precision, "precision", INFERENCE_PRECISIONS)
    if precision == "float32":
        return precision, jit_compile
    cpu, backend = cpu or cpu_features(), keras.backend.backend()
    on_cpu = not accelerator_count()
    reason = None
    if precision == "bfloat16" and on_cpu and not cpu.bf16:
        reason = f"this CPU ({cpu.describe()}) has no bfloat16 units (AVX512_BF16 or AMX-BF16)"
    elif precision == "bfloat16" and on_cpu and backend == "jax":
        reason = "XLA's CPU dot does not use the bf16 units (measured under JAX: no faster than float32)"
    elif precision == "int8" and on_cpu and not cpu.int8_dot:
        reason = (f"this CPU ({cpu.describe()}) has no int8 dot-product units (VNNI or AMX-INT8), and XLA's int8 "
                  "matmul without them is no faster than float32 (docs/benchmarks.md)")
    elif precision == "int8" and backend not in ("tensorflow", "jax"):
        reason = f"Keras's int8 layers are compiled to fast kernels under TensorFlow and JAX, not {backend}"
    elif precision == "int8" and jit_compile is False:
        reason = "int8 runs fast only compiled by XLA (`jit_compile=False` was asked)"
    if reason:
        warnings.warn(f"`precision`={precision!r} would run slower than float32 here: {reason}; using float32.",
                      stacklevel=3)
        return "float32", jit_compile
    return precision, JIT_FOR[precision]


def twin(model, precision):
    """``model`` in ``precision``: itself for float32, else a rebuilt copy holding its weights (cached)."""
    check_choice(precision, "precision", INFERENCE_PRECISIONS)
    if precision == "float32":
        return model
    from vit_keras.models.vision_transformer import VisionTransformer, sublayers

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"`precision`={precision!r} needs a vit_keras VisionTransformer (it rebuilds the model); "
                         f"got {type(model).__name__}. Use precision='float32'.")
    if not model.vit_config["include_top"]:
        raise ValueError(f"`precision`={precision!r} needs a classifier (include_top=True): it is checked by top-1 "
                         "agreement with float32. Use precision='float32' for features.")
    if any(layer.dtype_policy.quantization_mode for _, layer in sublayers(model)):
        raise ValueError(f"`model` is already quantized; predict it with precision='float32', not {precision!r}.")
    twins = TWINS.setdefault(model, {})
    if precision not in twins:
        twins[precision] = bfloat16_twin(model) if precision == "bfloat16" else int8_twin(model)
    return twins[precision]


def bfloat16_twin(model):
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy("bfloat16")  # every layer the rebuild creates; the head stays float32
    try:
        return model.rebuild()
    finally:
        keras.mixed_precision.set_global_policy(previous)


def int8_twin(model):
    copy = model.rebuild()
    copy.quantize("int8", filters=lambda layer: isinstance(layer, keras.layers.Dense))
    return copy


@dataclasses.dataclass
class Agreement:
    """A lower precision's top-1 agreement with float32 on the first images it ran (up to CHECK_IMAGES)."""

    images: int = 0
    matches: int = 0

    @property
    def value(self):
        return self.matches / self.images if self.images else 1.0

    @property
    def kept(self):
        return not self.images or self.value >= AGREEMENT_FLOOR

    @property
    def settled(self):
        """Checked on enough images, or already under the floor (which more images could not undo)."""
        return self.images >= CHECK_IMAGES or not self.kept

    def add(self, outputs, reference):
        """Count a batch's (logits) top-1 matches; warns once, with the figure, when that takes it under the floor."""
        was_kept = self.kept
        outputs, reference = np.asarray(outputs, "float32"), np.asarray(reference, "float32")
        self.images += len(reference)
        self.matches += int(np.sum(outputs.argmax(-1) == reference.argmax(-1)))
        return was_kept and not self.kept

    def describe(self, precision):
        return (f"`precision`={precision!r} agreed with float32 on {100 * self.value:.1f}% of the first {self.images} "
                f"images' top-1 classes, under the {100 * AGREEMENT_FLOOR:.1f}% it must keep")


def precision_line(model, precision):
    """What ran: ``precision`` with its measured agreement, or float32 where it was refused or fell back."""
    agreement = AGREEMENTS.get(model, {}).get(precision)
    if agreement is None:
        return f"precision: float32 ({precision} refused on this machine: see the warning above)"
    kept = precision if agreement.kept else "float32"
    return (f"precision: {kept} ({precision}'s top-1 agreement with float32 on the first {agreement.images} images: "
            f"{100 * agreement.value:.1f}%, floor {100 * AGREEMENT_FLOOR:.1f}%)")
