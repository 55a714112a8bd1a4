"""Keras ViT -> .tflite: float32, float16, dynamic-range or full-integer int8, builtin ops only, with metadata.

    from vit_keras.convert.export import export_tflite
    export_tflite("run/model.keras", "model.tflite", quantize="int8", calibration="fashion_mnist")

The file is written atomically (temp file + os.replace) after every check has
passed, so a failed export never leaves a partial file behind.
"""

import inspect
import os
import re

import numpy as np

from vit_keras.constants import INT8_RANGES, QUANTIZATIONS
from vit_keras.validation import check_keywords

from . import metadata as tflite_metadata
from .int8 import INT8_FLOAT_OPS, default_float_nodes, float_node_names, quantize_int8, split_float_ops
from .runtime_version import describe as describe_runtime
from .runtime_version import required_runtime
from .transposes import explicit_transposes

MIN_CALIBRATION_IMAGES = 100
DEFAULT_CALIBRATION_IMAGES = 300
METADATA_FIELDS = ("name", "description", "version", "license", "author")  # classifier_metadata's keywords
BYTES_PER_WEIGHT = {"float32": 4, "float16": 2, "dynamic": 1, "int8": 1}
FLATBUFFER_LIMIT = 2**31 - 2**26  # 2 GiB, less room for the graph and metadata (ViT-H/14 in float32 is 2.4 GiB)


def load_vit(path):
    """A vit_keras VisionTransformer classifier from a .keras file, with clear errors for anything else."""
    from vit_keras.models import load_model

    from .graph import check_vit

    return check_vit(load_model(path), source=os.fspath(path))


def read_labels_file(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`labels` file {path!r} does not exist; pass --labels FILE (one class name a line).")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def check_output_path(out):
    out = os.path.abspath(os.fspath(out))
    if os.path.isdir(out):
        raise ValueError(f"`out` {out!r} is a directory; give a file name such as model.tflite.")
    folder = os.path.dirname(out)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"`out` folder {folder!r} does not exist.")
    if not os.access(folder, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        raise PermissionError(f"`out` {out!r} is not writable.")
    return out


def calibration_images(calibration, model, limit=DEFAULT_CALIBRATION_IMAGES):
    """uint8 calibration images from a data spec or an array, at the model's size and channels (resized and
    converted as evaluation does, so any data the model trains on calibrates it).

    limit: the first ``limit`` images (None: all of them).
    """
    if calibration is None:
        raise ValueError("int8 needs `calibration` data: 'fashion_mnist', 'tfds:NAME' or 'folder:PATH' "
                         "(the training data spec), or an array of uint8 images.")
    from vit_keras.pipeline import fit_images

    if isinstance(calibration, str):
        from vit_keras.data import load_arrays

        images = load_arrays(calibration, split="train", limit=limit, image_size=model.vit_config["image_size"])[0]
    else:
        images = np.asarray(calibration)[:limit]
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)):
        raise ValueError(f"`calibration` must be uint8 images (N, H, W) or (N, H, W, 1|3); got shape {images.shape}.")
    if images.dtype != np.uint8 and images.size and (images.min() < 0 or images.max() <= 1.0 or images.max() > 255):
        raise ValueError("`calibration` must hold raw 0-255 pixels (uint8), as the exported int8 model takes them; "
                         f"got values in [{images.min()}, {images.max()}].")
    if len(images) < MIN_CALIBRATION_IMAGES:  # before resizing: an empty array has nothing to resize
        raise ValueError(f"`calibration` has {len(images)} images; int8 needs at least {MIN_CALIBRATION_IMAGES} "
                         "real images (a few hundred is best).")
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
        for i in range(len(images)):
            rgb = to_rgb(images[i:i + 1])
            if i == 0:
                rgb[0, 0, 0], rgb[0, 0, 1] = 0.0, 255.0
            yield [rgb]

    return generate


def unsupported_ops(model_bytes):
    """Names of the custom / Flex (SELECT_TF_OPS) operators in a .tflite flatbuffer."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(model_bytes, 0)
    names = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            names.append((code.CustomCode() or b"?").decode("utf-8"))
    return names


def check_builtin_ops(model_bytes, quantize):
    custom = unsupported_ops(model_bytes)
    if custom:
        raise ValueError(f"the {quantize} model needs non-builtin ops {', '.join(custom)}; "
                         "vit-keras exports TFLite builtin ops only (no Flex/SELECT_TF_OPS or custom ops).")


def convert(model, quantize="float32", calibration=None, dynamic_batch=False, float_ops=INT8_FLOAT_OPS,
            attention_output=False, ranges="mse"):
    """Converted flatbuffer bytes (no metadata yet); ValueError for anything but builtin ops.

    attention_output: a second output, the attention rollout (``attention_output.attention_rollout``).
    ranges: int8's activation ranges (``convert_graph``)."""
    from .graph import norm_count

    model_bytes = convert_graph(model, quantize, calibration, dynamic_batch, attention_output=attention_output,
                                ranges=ranges)
    if quantize == "int8":
        nodes = default_float_nodes(model, model_bytes) if float_ops else ()  # () alone: plain full int8
        if attention_output:  # the rollout's ADDs and output: its values, ~1/tokens, would lose to int8's rounding
            from .attention_output import rollout_output_names

            nodes = list(nodes) + rollout_output_names(model_bytes) + float_node_names(("attention_rollout",), sum(
                block.attn.num_heads for block in model.blocks))
        model_bytes = quantize_int8(model_bytes, float_ops, num_norms=norm_count(model), float_nodes=nodes)
    model_bytes = explicit_transposes(model_bytes)  # GPU-safe: no BATCH_MATMUL reads an operand transposed
    check_builtin_ops(model_bytes, quantize)
    if not attention_output:
        return bytes(model_bytes)
    from .attention_output import scores_output_first

    return scores_output_first(model_bytes)


def check_ranges(ranges):
    if ranges not in INT8_RANGES:
        raise ValueError(f"Unknown `ranges`={ranges!r} (--ranges); valid values are {', '.join(INT8_RANGES)}.")


def convert_graph(model, quantize="float32", calibration=None, dynamic_batch=False, smooth_norms=False,
                  attention_output=False, ranges="mse"):
    """The TFLite converter's output: the final model, or for int8 the calibrated float model.

    calibration: int8's calibration images (an array, as ``calibration_images`` returns them), all used.
    smooth_norms: int8 only; the blocks' LayerNorm outputs smoothed into the next FULLY_CONNECTED
      (``graph.norm_scales``; what it buys: docs/benchmarks.md, "int8 on models trained elsewhere").
    ranges: int8 only; "mse": each activation's range is the one with the least int8 rounding and clipping
      error over the calibration images (``ranges.mse_ranges``); "minmax": their min and max, as the converter
      records them.
    """
    import tensorflow as tf

    from .graph import concrete_function, norm_scales, qkv_scales, takes_raw_pixels

    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown `quantize`={quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
    check_ranges(ranges)
    scales = smoothing = None
    if quantize == "int8":
        calibration = calibration_images(calibration, model, limit=None)
        scales = qkv_scales(model, calibration)  # int8's fused qkv, its heads' ranges equalized
        smoothing = norm_scales(model, calibration) if smooth_norms else None
    function = concrete_function(model, raw_pixels=takes_raw_pixels(model, quantize),
                                 batch_size=None if dynamic_batch else 1, qkv_scales=scales, norm_scales=smoothing,
                                 attention_output=attention_output)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = False
    if quantize != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif quantize == "int8":
        batches = representative_dataset(calibration)  # the calibrator's images, and then the range pass's
        converter.representative_dataset = batches
        # Calibrate only, then quantize with the float-kept ops (the QuantizationDebugger's path).
        converter.experimental_mlir_quantizer = True
        converter._experimental_calibrate_only = True
    try:
        model_bytes = converter.convert()
    except Exception as error:
        ops = sorted(set(re.findall(r"\btf\.(\w+)", str(error))))
        named = f" (ops: {', '.join(ops)})" if ops else ""
        raise ValueError(f"TFLite conversion with `quantize`={quantize!r} failed{named}: the export needs "
                         f"TFLite builtin ops only, no Flex/SELECT_TF_OPS. {str(error)[-800:]}") from error
    if quantize == "int8" and ranges == "mse":
        from .ranges import mse_ranges

        model_bytes = mse_ranges(model_bytes, (batch for batch, in batches()))
    return model_bytes


def check_runtime(model_bytes, quantize):
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


def classifier_metadata(model, labels, quantize, input_dtype, name=None, description=None, version="1",
                        license="Apache-2.0", author="vit-keras"):
    """The ModelMetadata dict for an image classifier, as MediaPipe's ImageClassifier reads it.

    Its NormalizationOptions hold one mean and std (MediaPipe refuses per-channel ones): the model's own
    where its channels share them, else mean 0, std 1 for the raw pixels the graph normalizes itself."""
    from vit_keras.normalization import pixel_normalization

    from .graph import takes_raw_pixels

    config = model.vit_config
    raw = np.dtype(input_dtype) == np.uint8 or takes_raw_pixels(model, quantize)
    mean, std = ([0.0], [1.0]) if raw else ([float(v[0])] for v in pixel_normalization(config))
    low, high = ((0.0 - mean[0]) / std[0], (255.0 - mean[0]) / std[0])
    height, width = config["image_size"]
    return {
        "name": name or model.name,
        "description": description or (
            f"Vision Transformer image classifier ({config['num_layers']} layers, width {config['hidden_size']}, "
            f"patch {config['patch_size']}), {quantize} TFLite, {len(labels)} classes."),
        "version": str(version),
        "author": author,
        "license": license,
        "subgraph_metadata": [{
            "input_tensor_metadata": [{
                "name": "image",
                "description": f"RGB image {height}x{width}, " + (
                    "raw 0-255 pixels." if raw else "normalized as (pixel - mean) / std."),
                "content": {"content_properties_type": "ImageProperties",
                            "content_properties": {"color_space": "RGB",
                                                   "default_size": {"width": width, "height": height}}},
                "process_units": [{"options_type": "NormalizationOptions",
                                   "options": {"mean": mean, "std": std}}],
                "stats": {"max": [high], "min": [low]},
            }],
            "output_tensor_metadata": [{
                "name": "probability",
                "description": f"Softmax probabilities of the {len(labels)} classes.",
                "content": {"content_properties_type": "FeatureProperties", "content_properties": {}},
                "stats": {"max": [1.0], "min": [0.0]},
                "associated_files": [{"name": "labels.txt", "description": "Class names, one a line, in score order.",
                                      "type": "TENSOR_AXIS_LABELS"}],
            }],
        }],
    }


def write_atomic(path, data):
    """``data`` to ``path`` atomically; any OS error names `out`."""
    from vit_keras.files import write_bytes

    try:
        write_bytes(path, data)
    except PermissionError as error:
        raise PermissionError(f"`out` {path!r} is not writable: {error}") from error
    except OSError as error:  # a full disk, a vanished folder: say so, not "not writable"
        raise OSError(error.errno, f"could not write `out` {path!r}: {error.strerror or error}") from error


def check_metadata_keywords(metadata_fields):
    """Refuse keywords that reach ``export_tflite``'s ``**metadata_fields`` but are no metadata field, naming the
    nearest of all its keywords (a misspelt ``quantize`` lands there too)."""
    parameters = [name for name in inspect.signature(export_tflite).parameters if name != "metadata_fields"]
    try:
        check_keywords(metadata_fields, parameters + list(METADATA_FIELDS), "export_tflite()")
    except TypeError as error:
        raise TypeError(f"{error} Metadata fields (stored in the file), valid: {', '.join(METADATA_FIELDS)}.") from None


def export_tflite(model, out, quantize="float32", calibration=None, labels=None, dynamic_batch=False,
                  calibration_size=DEFAULT_CALIBRATION_IMAGES, float_ops=INT8_FLOAT_OPS, min_agreement=None,
                  attention_output=False, ranges="mse", **metadata_fields):
    """Export ``model`` (a .keras path or a VisionTransformer) to ``out``; returns a summary dict.

    labels: a list, a file path, or None for labels.txt beside the .keras file.
    calibration: a data spec or uint8 images (N, H, W, C); required for int8.
    float_ops: the TFLite op types (or dense roles: ``split_float_ops``) int8 keeps in float, besides the residual
      stream and a conv stem (any set but () keeps those too, as ``convert.sensitivity`` measures); () gives a plain
      full-int8 graph.
    min_agreement: int8 only; instead of ``float_ops``, keep the fewest ops in float whose top-1 agreement with
      Keras on a held-out part of the calibration images is at least this (``held_out_count`` of them, never
      calibrated on); the summary's "sweep" holds the rows tried (agreement, size, latency).
    attention_output: a second output, (1, grid_h, grid_w): the attention rollout from the token the prediction
      reads to the patches (``attention_output.attention_rollout``), named "attention" in the metadata.
    """
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown `quantize`={quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
    check_metadata_keywords(metadata_fields)
    check_ranges(ranges)
    if quantize == "int8" and (calibration_size is None or int(calibration_size) < MIN_CALIBRATION_IMAGES):
        raise ValueError(f"`calibration_size` must be at least {MIN_CALIBRATION_IMAGES} (int8 calibrates on that "
                         f"many real images; {DEFAULT_CALIBRATION_IMAGES} by default); got {calibration_size}.")
    if attention_output and min_agreement is not None:
        raise ValueError("`attention_output` and `min_agreement` do not combine: the float-ops sweep measures the "
                         "classifier alone; export with `float_ops` instead.")
    split_float_ops(float_ops)  # a bad role fails here, before any conversion
    if min_agreement is not None:
        from .sensitivity import check_min_agreement, convert_fewest_float_ops

        check_min_agreement(min_agreement, quantize, calibration_size)
    out = check_output_path(out)
    if isinstance(model, (str, os.PathLike)):
        if labels is None:
            labels = os.path.join(os.path.dirname(os.path.abspath(model)), "labels.txt")
        model = load_vit(model)
    else:
        from .graph import check_vit

        check_vit(model)
    if labels is None:
        raise ValueError("`labels` is required when exporting an in-memory model.")
    if isinstance(labels, (str, os.PathLike)):
        labels = read_labels_file(os.fspath(labels))
    weight_bytes = model.count_params() * BYTES_PER_WEIGHT[quantize]
    if weight_bytes >= FLATBUFFER_LIMIT:
        raise ValueError(f"`quantize`={quantize!r} gives {model.count_params():,} weights of {weight_bytes / 2**30:.1f} "
                         "GiB, over the 2 GiB a .tflite flatbuffer holds; use float16, dynamic or int8.")
    num_classes = model.vit_config["num_classes"]
    if len(labels) != num_classes:
        raise ValueError(f"`labels` has {len(labels)} names but the model has {num_classes} classes.")
    if quantize == "int8":
        calibration = calibration_images(calibration, model, limit=calibration_size)
    sweep = None
    if min_agreement is not None:
        model_bytes, sweep = convert_fewest_float_ops(model, calibration, dynamic_batch, min_agreement, ranges)
    else:
        model_bytes = convert(model, quantize, calibration, dynamic_batch, float_ops, attention_output, ranges)
    detail = check_runtime(model_bytes, quantize)
    meta = classifier_metadata(model, labels, quantize, detail["dtype"], **metadata_fields)
    files = {"labels.txt": "\n".join(labels).encode("utf-8") + b"\n"}
    if attention_output:
        from .attention_output import ATTENTION_LABELS, attention_labels, attention_metadata

        meta["subgraph_metadata"][0]["output_tensor_metadata"].append(attention_metadata(model))
        files[ATTENTION_LABELS] = "\n".join(attention_labels(model)).encode("utf-8") + b"\n"
    runtime = required_runtime(model_bytes)  # recorded as the model's "min_runtime_version" where known
    data = tflite_metadata.populate(model_bytes, meta, files, min_runtime_version=runtime["version"])
    write_atomic(out, data)
    return {"path": out, "quantize": quantize, "bytes": len(data), "input_dtype": np.dtype(detail["dtype"]).name,
            "input_shape": [int(v) for v in detail["shape_signature"]], "input_quantization": detail["quantization"],
            "labels": len(labels), "min_runtime_version": runtime["version"], "runtime": describe_runtime(runtime),
            **({"sweep": sweep} if sweep is not None else {})}
