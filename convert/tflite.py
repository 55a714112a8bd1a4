"""Keras ViT -> TFLite flatbuffer bytes: the converter, int8's calibration, and the checks every file passes.

``export.export_tflite`` builds on this: it adds metadata and writes the file.
"""

import dataclasses
import os
import re

import numpy as np

from vit_keras import framework
from vit_keras.constants import DEFAULT_CALIBRATION_IMAGES, MIN_CALIBRATION_IMAGES, QUANTIZATIONS, VAL_FRACTION
from vit_keras.data.datasets import load_arrays
from vit_keras.models.vision_transformer import load_model
from vit_keras.ticker import Ticker

from .attention_output import scores_output_first
from .dynamic_int8 import int8_from_float
from .weight_rounding import recompensate
from .flatbuffer import builtin, builtin_code, compact, float_compute_ops, raw_pixel_input, read_model
from .graph import check_vit, concrete_function, forward, takes_raw_pixels
from .integer_graph import IntegerRanges
from .int8 import check_ranges, int8_graph_scales, quantize_static, resolve_int8
from .ranges import mse_ranges
from .transposes import explicit_transposes


def load_vit(path):
    """A vit_keras VisionTransformer classifier from a .keras file, with clear errors for anything else."""
    return check_vit(load_model(path), source=os.fspath(path))


def calibration_images(calibration, model, limit=DEFAULT_CALIBRATION_IMAGES):
    """uint8 calibration images from a data spec or an array, at the model's size and channels (resized and
    converted as evaluation does, so any data the model trains on calibrates it).

    limit: the first ``limit`` images (None: all of them).
    """
    if calibration is None:
        raise ValueError("int8 needs `calibration` data: 'fashion_mnist', 'tfds:NAME' or 'folder:PATH' "
                         "(the training data spec), or an array of uint8 images.")
    from vit_keras.data.pipeline import fit_images

    if isinstance(calibration, str):
        try:
            images = load_arrays(calibration, split="train", limit=limit, image_size=model.vit_config["image_size"])[0]
        except (ValueError, OSError) as error:  # a missing folder, no images, an unknown spec: say which option
            raise type(error)(f"`calibration` (--calibration) {calibration!r}: {error}") from error
    else:
        images = np.asarray(calibration)[:limit]
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
        raise ValueError("`calibration` (--calibration) must be uint8 images (N, H, W) or (N, H, W, 1|3), gray or "
                         f"RGB; got shape {images.shape}.")
    if images.dtype != np.uint8 and images.size and (images.min() < 0 or images.max() <= 1.0 or images.max() > 255):
        raise ValueError("`calibration` (--calibration) must hold raw 0-255 pixels (uint8), as the exported int8 "
                         f"model takes them; got values in [{images.min()}, {images.max()}].")
    if len(images) < MIN_CALIBRATION_IMAGES:  # before resizing: an empty array has nothing to resize
        where = (f" (a folder calibrates on its training part, {1 - VAL_FRACTION:.0%} of it)"
                 if isinstance(calibration, str) else "")
        raise ValueError(f"`calibration` (--calibration) has {len(images)} images{where}; int8 needs at least "
                         f"{MIN_CALIBRATION_IMAGES} real images (a few hundred is best).")
    return fit_images(np.clip(np.round(images), 0, 255).astype(np.uint8), model.vit_config["image_size"],
                      model.vit_config["channels"])  # whole pixels, as the uint8 input carries them


def to_rgb(images):
    """A float32 RGB copy: the caller's array is never written to."""
    images = np.array(images, "float32")
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def representative_dataset(images):
    """The calibration images as the float graph takes them, one batch of one image at a time: float32 RGB raw
    pixels, made image by image (no float copy of the whole set). One pixel at 0 and one at 255 pin the input
    range to [0, 255]: the uint8 input then carries raw pixels exactly (scale 1, zero point 0), as Android's
    classifiers feed them."""

    def generate():
        ticker = Ticker("int8 calibration", len(images))  # a line every so often: it takes minutes at 224 px
        for i in range(len(images)):
            rgb = to_rgb(images[i:i + 1])
            if i == 0:
                rgb[0, 0, 0], rgb[0, 0, 1] = 0.0, 255.0
            yield [rgb]
            ticker.update(1)

    return generate


def unsupported_ops(model_bytes):
    """Names of the custom / Flex (SELECT_TF_OPS) operators in a .tflite flatbuffer."""
    model = read_model(model_bytes)
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        if builtin_code(code) == builtin("CUSTOM"):
            names.append((code.CustomCode() or b"?").decode("utf-8"))
    return names


def check_builtin_ops(model_bytes, quantize):
    custom = unsupported_ops(model_bytes)
    if custom:
        raise ValueError(f"the {quantize} model needs non-builtin ops {', '.join(custom)}; "
                         "vit-keras exports TFLite builtin ops only (no Flex/SELECT_TF_OPS or custom ops).")


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """One conversion, decided once: the mode, int8's resolved choices and its calibration images.

    activations: int8 only, "dynamic", "static" or "int16" (the npu target; ``int8.resolve_int8``);
    float_ops, ranges: static int8's; calibration: int8's uint8 images at the model's size (``calibration_images``).
    """

    quantize: str = "float32"
    target: str = "cpu"
    activations: str = None
    float_ops: tuple = None
    ranges: str = None
    dynamic_batch: bool = False
    attention_output: bool = False
    calibration: np.ndarray = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def resolve(cls, model, quantize="float32", calibration=None, calibration_size=None, dynamic_batch=False,
                float_ops=None, attention_output=False, ranges=None, activations="auto", target="cpu",
                min_agreement=None):
        """The plan for ``model``: "auto" int8 decided, defaults filled in, calibration images read and fitted
        (the first ``calibration_size``; None: all)."""
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"Unknown `quantize`={quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
        if quantize != "int8":
            return cls(quantize, target, dynamic_batch=dynamic_batch, attention_output=attention_output)
        activations, float_ops, ranges = resolve_int8(model, activations, float_ops, ranges, min_agreement, target)
        return cls(quantize, target, activations, None if float_ops is None else tuple(float_ops), ranges,
                   dynamic_batch, attention_output, calibration_images(calibration, model, limit=calibration_size))


def convert(model, quantize="float32", calibration=None, dynamic_batch=False, float_ops=None,
            attention_output=False, ranges=None, activations="auto", target="cpu"):
    """Converted flatbuffer bytes (no metadata yet); ValueError for anything but builtin ops.

    attention_output: a second output, the attention rollout (``attention_output.rollout_graph``).
    activations, float_ops, ranges, target: int8's (``int8.resolve_int8``)."""
    return convert_plan(model, ExportPlan.resolve(model, quantize, calibration, None, dynamic_batch, float_ops,
                                                  attention_output, ranges, activations, target))


def convert_plan(model, plan):
    """``convert`` of a resolved ``ExportPlan``."""
    if plan.activations == "int16":
        return convert_full_integer(model, plan.calibration)
    model_bytes = convert_graph(model, plan.quantize, plan.calibration, plan.dynamic_batch,
                                attention_output=plan.attention_output, ranges=plan.ranges,
                                activations=plan.activations or "static")
    if plan.activations == "dynamic":
        # Every calibration image feeds GPTQ's X^T X: 64 images of 37 tokens left a 96-px model's 768-wide Gram
        # matrices ill-estimated (99.45% agreement on CIFAR-10 against 99.85% with all 300).
        model_bytes = int8_from_float(model_bytes, to_rgb(plan.calibration))
    elif plan.quantize == "int8":
        model_bytes = quantize_static(model, model_bytes, plan.float_ops, plan.attention_output)
    model_bytes = explicit_transposes(model_bytes)  # GPU-safe: no BATCH_MATMUL reads an operand transposed
    check_builtin_ops(model_bytes, plan.quantize)
    if not plan.attention_output:
        return bytes(model_bytes)
    return scores_output_first(model_bytes)


def convert_graph(model, quantize="float32", calibration=None, dynamic_batch=False, attention_output=False,
                  ranges="mse", activations="static"):
    """The TFLite converter's output: the final model, or for int8 the float model it quantizes: calibrated
    (``activations`` "static") or, for dynamic int8, its float graph with the dense inputs smoothed.

    calibration: int8's calibration images (an array, as ``calibration_images`` returns them), all used.
    ranges: static int8 only; "mse": each activation's range is the one with the least int8 rounding and clipping
      error over the calibration images (``ranges.mse_ranges``); "minmax": their min and max, as the converter
      records them.
    """
    import tensorflow as tf

    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown `quantize`={quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
    static = quantize == "int8" and activations == "static"
    if static:
        check_ranges(ranges)
    scales = smoothing = None
    if quantize == "int8":
        calibration = calibration_images(calibration, model, limit=None)
        scales, smoothing = int8_graph_scales(model, calibration, activations)
    function = concrete_function(model, raw_pixels=takes_raw_pixels(model, quantize),
                                 batch_size=None if dynamic_batch else 1, qkv_scales=scales, norm_scales=smoothing,
                                 attention_output=attention_output)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = False
    if quantize in ("float16", "dynamic") or static:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif static:
        batches = representative_dataset(calibration)  # the calibrator's images, and then the range pass's
        converter.representative_dataset = batches
        # Calibrate only, then quantize with the float-kept ops (the QuantizationDebugger's path).
        converter.experimental_mlir_quantizer = True
        framework.calibrate_only(converter)
    try:
        model_bytes = converter.convert()
    except Exception as error:
        ops = sorted(set(re.findall(r"\btf\.(\w+)", str(error))))
        named = f" (ops: {', '.join(ops)})" if ops else ""
        raise ValueError(f"TFLite conversion with `quantize`={quantize!r} failed{named}: the export needs "
                         f"TFLite builtin ops only, no Flex/SELECT_TF_OPS. {str(error)[-800:]}") from error
    if static and ranges == "mse":
        model_bytes = mse_ranges(model_bytes, (batch for batch, in batches()))
    return model_bytes


def calibrated_variances(model, calibration, batch_size=32):
    """The npu graph's ``IntegerRanges`` (each normalization's variance, the stream's and the MLPs' channels) over
    uint8 ``calibration`` images, from an eager pass a batch at a time (one float copy of a batch, not of the set)."""
    import tensorflow as tf

    variances = IntegerRanges()
    for start in range(0, len(calibration), batch_size):
        batch = tf.constant(to_rgb(calibration[start:start + batch_size]))
        forward(model, batch, raw_pixels=True, variances=variances)
    variances.recording = False
    return variances


def convert_full_integer(model, calibration):
    """The "npu" target: every op from the uint8 input to the int16 scores in integers, int8 weights and int16
    activations (TFLite's 16x8 mode), over the graph written to hold in int16 (``integer_graph``).
    ValueError, naming the ops, if any op is left computing in float."""
    import tensorflow as tf

    function = concrete_function(model, raw_pixels=True, variances=calibrated_variances(model, calibration))
    float_bytes = tf.lite.TFLiteConverter.from_concrete_functions([function]).convert()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative_dataset(calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    converter.inference_output_type = tf.int16
    # Biases stay int64 (16x8's default): with int32 ones the kernels accumulate in int32, which lost 0.8 points of
    # agreement on the real ViT-Ti/16 (docs/export.md#full-integer-for-npus---target-npu).
    try:
        model_bytes = converter.convert()
    except (RuntimeError, ValueError) as error:  # an op with no 16x8 kernel: the converter names it
        raise ValueError(f"the npu target (full integer, int16 activations) can't express this model: {error}") \
            from error
    # The converter rounds each weight to its nearest level; GPTQ's levels keep the patch embedding's and the dense
    # layers' outputs closest (docs/export.md#full-integer-for-npus---target-npu).
    model_bytes = recompensate(model_bytes, float_bytes, to_rgb(calibration))
    model_bytes = explicit_transposes(raw_pixel_input(model_bytes))  # GPU-safe, as every mode
    model_bytes = compact(model_bytes)  # the file's size is a target: ~70 KB of calibration leftovers and names
    floats = float_compute_ops(model_bytes)
    if floats:
        named = ", ".join(f"{op} ({tensor})" for op, tensor in floats[:8])
        raise ValueError(f"the npu target must be integer throughout, but {len(floats)} ops compute in float: "
                         f"{named}; this model's layers can't all be expressed in int8/int16 kernels.")
    return model_bytes


def check_litert_runs(model_bytes, quantize):
    """Load and run the model once in LiteRT, so a mode the runtime rejects fails here, not on a phone."""
    from ai_edge_litert.interpreter import Interpreter

    try:
        interpreter = Interpreter(model_content=model_bytes)
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
        interpreter.invoke()
    except Exception as error:
        raise ValueError(f"LiteRT rejects the `quantize`={quantize!r} model: {error}") from error
    return detail
