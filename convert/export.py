"""Keras ViT -> .tflite: float32, float16, dynamic-range or full-integer int8, builtin ops only, with metadata.

    from vit_keras.convert.export import export_tflite
    export_tflite("run/model.keras", "model.tflite", quantize="int8", calibration="fashion_mnist")

The file is written atomically (temp file + os.replace) after every check has
passed, so a failed export never leaves a partial file behind.
"""

import contextlib
import inspect
import os

import numpy as np

from vit_keras import locks
from vit_keras.constants import DEFAULT_CALIBRATION_IMAGES, EXPORT_TARGETS, MIN_CALIBRATION_IMAGES, QUANTIZATIONS
from vit_keras.files import DiskFull, write_bytes
from vit_keras.models.normalization import pixel_normalization
from vit_keras.validation import check_keywords

from . import metadata as tflite_metadata
from .attention_output import ATTENTION_LABELS, attention_labels, attention_metadata
from .graph import check_vit, takes_raw_pixels
from .int8 import check_int8_options, split_float_ops
from .runtime_version import describe as describe_runtime
from .runtime_version import required_runtime
from .sensitivity import check_min_agreement, convert_fewest_float_ops
from .tflite import ExportPlan, check_litert_runs, convert_plan, load_vit

METADATA_FIELDS = ("name", "description", "version", "license", "author")  # classifier_metadata's keywords
BYTES_PER_WEIGHT = {"float32": 4, "float16": 2, "dynamic": 1, "int8": 1}
FLATBUFFER_LIMIT = 2**31 - 2**26  # 2 GiB, less room for the graph and metadata (ViT-H/14 in float32 is 2.4 GiB)


def read_labels_file(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`labels` file {path!r} does not exist and the model names no classes; pass --labels "
                                "FILE (one class name a line).")
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


@contextlib.contextmanager
def export_lock(out):
    """Hold ``out`` (``vit_keras.locks``: a lock file beside it) while the block runs; a folder that takes no new
    file is named as `out`, as the write would name it."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locks.hold(os.path.dirname(out), "export", lock_name=f".{os.path.basename(out)}.lock"))
        except (locks.FolderLocked, DiskFull):
            raise
        except OSError as error:
            raise OSError(error.errno, f"could not write `out` {out!r}: {error.strerror or error}") from error
        yield


def classifier_metadata(model, labels, quantize, input_dtype, name=None, description=None, version="1",
                        license="Apache-2.0", author="vit-keras"):
    """The ModelMetadata dict for an image classifier, as MediaPipe's ImageClassifier reads it.

    Its NormalizationOptions hold one mean and std (MediaPipe refuses per-channel ones): the model's own
    where its channels share them, else mean 0, std 1 for the raw pixels the graph normalizes itself."""
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
    try:
        write_bytes(path, data)
    except PermissionError as error:
        raise PermissionError(f"`out` {path!r} is not writable: {error}") from error
    except DiskFull:
        raise  # it names the path and what to do
    except OSError as error:  # a vanished folder: say so, not "not writable"
        raise OSError(error.errno, f"could not write `out` {path!r}: {error.strerror or error}") from error


def check_metadata_keywords(metadata_fields):
    """Refuse keywords that reach ``export_tflite``'s ``**metadata_fields`` but are no metadata field, naming the
    nearest of all its keywords (a misspelt ``quantize`` lands there too)."""
    parameters = [name for name in inspect.signature(export_tflite).parameters if name != "metadata_fields"]
    try:
        check_keywords(metadata_fields, parameters + list(METADATA_FIELDS), "export_tflite()")
    except TypeError as error:
        raise TypeError(f"{error} Metadata fields (stored in the file), valid: {', '.join(METADATA_FIELDS)}.") from None


def check_export_options(quantize, metadata_fields, calibration_size, float_ops, min_agreement, attention_output,
                         ranges, int8_activations, target="cpu", dynamic_batch=False):
    """Every export option checked before any model or data loads."""
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown `quantize`={quantize!r}; valid values are {', '.join(QUANTIZATIONS)}.")
    check_target(target, quantize, int8_activations, float_ops, ranges, min_agreement, attention_output,
                 dynamic_batch)
    check_metadata_keywords(metadata_fields)
    check_int8_options(int8_activations, float_ops, ranges, min_agreement)
    if quantize == "int8" and (calibration_size is None or int(calibration_size) < MIN_CALIBRATION_IMAGES):
        raise ValueError(f"`calibration_size` must be at least {MIN_CALIBRATION_IMAGES} (int8 calibrates on that "
                         f"many real images; {DEFAULT_CALIBRATION_IMAGES} by default); got {calibration_size}.")
    if attention_output and min_agreement is not None:
        raise ValueError("`attention_output` and `min_agreement` do not combine: the float-ops sweep measures the "
                         "classifier alone; export with `float_ops` instead.")
    split_float_ops(float_ops or ())  # a bad role fails here, before any conversion
    if min_agreement is not None:
        check_min_agreement(min_agreement, quantize, calibration_size)


def check_target(target, quantize, int8_activations="auto", float_ops=None, ranges=None, min_agreement=None,
                 attention_output=False, dynamic_batch=False):
    """ValueError for an unknown `target`, or for the npu target with an option it has no use for."""
    if target not in EXPORT_TARGETS:
        raise ValueError(f"Unknown `target`={target!r} (--target); valid values are {', '.join(EXPORT_TARGETS)}.")
    if target != "npu":
        return
    if quantize != "int8":
        raise ValueError(f"`target`='npu' (--target npu) is a full-integer file: it needs `quantize`='int8' "
                         f"(--quantize int8), not {quantize!r}.")
    asked = {"`int8_activations` (--int8-activations)": int8_activations != "auto", "`float_ops`": float_ops,
             "`ranges` (--ranges)": ranges, "`min_agreement` (--min-agreement)": min_agreement,
             "`attention_output` (--attention-output)": attention_output,
             "`dynamic_batch` (--dynamic-batch)": dynamic_batch}
    for name, value in asked.items():
        if value:
            raise ValueError(f"{name} does not apply to `target`='npu': its activations are int16 throughout and "
                             "its shapes fixed, as NPU compilers need; leave it out.")


def export_tflite(model, out, quantize="float32", calibration=None, labels=None, dynamic_batch=False,
                  calibration_size=DEFAULT_CALIBRATION_IMAGES, float_ops=None, min_agreement=None,
                  attention_output=False, ranges=None, int8_activations="auto", target="cpu", **metadata_fields):
    """Export ``model`` (a .keras path or a VisionTransformer) to ``out``; returns a summary dict.

    labels: a list, a file path, or None: the model's own ``class_names``, else labels.txt beside the .keras file.
    calibration: a data spec or uint8 images (N, H, W, C); required for int8.
    int8_activations: "dynamic": int8 weights, each dense layer's input rounded to int8 a token at a time as it
      runs (``dynamic_int8``; TFLite 2.17+); "static": full integer, one scale a tensor fixed at calibration
      (TFLite 2.9+); "auto" (default): ``int8.resolve_int8`` picks, dynamic for models from ViT-Ti's width up.
    float_ops: static int8 only; the TFLite op types (or dense roles: ``split_float_ops``) kept in float, besides
      the residual stream and a conv stem (any set but () keeps those too, as ``convert.sensitivity`` measures);
      () gives a plain full-int8 graph; None: ``int8.INT8_FLOAT_OPS``.
    min_agreement: static int8 only; instead of ``float_ops``, keep the fewest ops in float whose top-1 agreement
      with Keras on a held-out part of the calibration images is at least this (``held_out_count`` of them, never
      calibrated on); the summary's "sweep" holds the rows tried (agreement, size, latency).
    ranges: static int8 only; "mse" (None) or "minmax" (``tflite.convert_graph``).
    attention_output: a second output, (1, grid_h, grid_w): the attention rollout from the token the prediction
      reads to the patches (``attention_output.rollout_graph``), named "attention" in the metadata.
    target: "cpu" (default): the file each mode gives; "npu": with int8, a full-integer file (int8 weights, int16
      activations, uint8 input, int16 scores; ``tflite.convert_full_integer``), as phone NPUs take them.
    """
    check_export_options(quantize, metadata_fields, calibration_size, float_ops, min_agreement, attention_output,
                         ranges, int8_activations, target, dynamic_batch)
    out = check_output_path(out)
    with export_lock(out):  # one writer
        beside = None
        if isinstance(model, (str, os.PathLike)):
            beside = os.path.join(os.path.dirname(os.path.abspath(model)), "labels.txt")
            model = load_vit(model)
        else:
            check_vit(model)
        if labels is None:
            labels = model.class_names or beside
        if labels is None:
            raise ValueError("`labels` is required when exporting an in-memory model whose `class_names` are unset.")
        if isinstance(labels, (str, os.PathLike)):
            labels = read_labels_file(os.fspath(labels))
        weight_bytes = model.count_params() * BYTES_PER_WEIGHT[quantize]
        if weight_bytes >= FLATBUFFER_LIMIT:
            raise ValueError(f"`quantize`={quantize!r} gives {model.count_params():,} weights of "
                             f"{weight_bytes / 2**30:.1f} "
                             "GiB, over the 2 GiB a .tflite flatbuffer holds; use float16, dynamic or int8.")
        num_classes = model.vit_config["num_classes"]
        if len(labels) != num_classes:
            raise ValueError(f"`labels` has {len(labels)} names but the model has {num_classes} classes.")
        plan = ExportPlan.resolve(model, quantize, calibration, calibration_size, dynamic_batch, float_ops,
                                  attention_output, ranges, int8_activations, target, min_agreement)
        sweep = None
        if min_agreement is not None:
            model_bytes, sweep = convert_fewest_float_ops(model, plan.calibration, dynamic_batch, min_agreement,
                                                          plan.ranges)
        else:
            model_bytes = convert_plan(model, plan)
        detail = check_litert_runs(model_bytes, quantize)
        meta = classifier_metadata(model, labels, quantize, detail["dtype"], **metadata_fields)
        files = {"labels.txt": "\n".join(labels).encode("utf-8") + b"\n"}
        if attention_output:
            meta["subgraph_metadata"][0]["output_tensor_metadata"].append(attention_metadata(model))
            files[ATTENTION_LABELS] = "\n".join(attention_labels(model)).encode("utf-8") + b"\n"
        runtime = required_runtime(model_bytes)  # recorded as the model's "min_runtime_version" where known
        data = tflite_metadata.populate(model_bytes, meta, files, min_runtime_version=runtime["version"])
        write_atomic(out, data)
        return {"path": out, "quantize": quantize, "bytes": len(data), "input_dtype": np.dtype(detail["dtype"]).name,
                "input_shape": [int(v) for v in detail["shape_signature"]],
                "input_quantization": detail["quantization"],
                "labels": len(labels), "min_runtime_version": runtime["version"], "runtime": describe_runtime(runtime),
                **({"sweep": sweep} if sweep is not None else {})}
