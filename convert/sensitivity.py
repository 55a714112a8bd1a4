"""Per-op sensitivity of int8 quantization: which op types, kept in float, bring the int8 model back to Keras.

The ViT literature reports int8 collapses from LayerNorm, GELU and softmax outliers. This
sweep calibrates once, then quantizes the same calibrated graph with one more op type left
in float at a time, and measures top-1 agreement and the largest score error against Keras.
The residual stream and a conv stem stay in float in every row with float ops, as ``export`` keeps them
for any ``float_ops`` but (), so each row is the file ``export_tflite(float_ops=row["float_ops"])`` writes.

    from vit_keras.convert.sensitivity import op_sensitivity, fewest_float_ops
    rows = op_sensitivity(model, calibration_images, test_images)
    model_bytes, rows = fewest_float_ops(model, calibration_images, held_out_images, min_agreement=0.995)
"""

import math
import numbers
import os
import tempfile

import numpy as np

from vit_keras.constants import MIN_CALIBRATION_IMAGES

from .graph import keras_scores, norm_count
from .node_names import DENSE_ROLES
from .int8 import (INT8_FLOAT_OPS, INT8_XNNPACK_FLOAT_OPS, default_float_nodes, dense_role_nodes, quantize_int8,
                   split_float_ops)
from .runtime import latency_ms, op_precisions, tflite_scores
from .tflite import calibration_images, check_builtin_ops, convert_graph
from .transposes import explicit_transposes

CANDIDATES = ("CONV_2D", "FULLY_CONNECTED", "ADD", "MEAN", "SUB", "MUL", "CONCATENATION")
# What ``fewest_float_ops`` may add to the default int8 file's float ops (INT8_FLOAT_OPS): the other ADDs, then
# the ops that hold the weights, the dense layers one role at a time (each role in float gives up its share of
# int8's size and speed: the head almost none, fc1 or fc2 a third of a block's).
SWEEP_CANDIDATES = (("ADD",), ("CONV_2D",), *((f"FULLY_CONNECTED:{role}",) for role in DENSE_ROLES))
SAME_SIZE = 0.02  # files within this fraction of each other's size count as the same size when the sweep chooses
MIN_HELD_OUT_IMAGES = 100  # the least that `min_agreement`'s sweep measures agreement on
DISAGREEMENTS_ALLOWED = 5  # that the target allows among the held-out images (``held_out_count``)


def held_out_count(min_agreement):
    """How many calibration images ``min_agreement``'s sweep holds out to measure on: enough that the target
    allows DISAGREEMENTS_ALLOWED disagreements among them (at 0.995: 5 in 1,000; with 1 in 200 a file that
    matches on 99.3% of images passes one time in five), and at least MIN_HELD_OUT_IMAGES."""
    if min_agreement >= 1:
        return MIN_HELD_OUT_IMAGES
    return max(MIN_HELD_OUT_IMAGES, math.ceil(round(DISAGREEMENTS_ALLOWED / (1 - min_agreement), 6)))


def check_min_agreement(min_agreement, quantize, calibration_size):
    """Refuse a `min_agreement` outside (0, 1], on a mode other than int8, or with too few calibration images
    to calibrate on MIN_CALIBRATION_IMAGES and hold out ``held_out_count`` (before any data loads)."""
    if min_agreement is None:
        return
    if (not isinstance(min_agreement, numbers.Real) or isinstance(min_agreement, bool)
            or not 0 < min_agreement <= 1):
        raise ValueError(f"`min_agreement` (--min-agreement) must be a top-1 agreement in (0, 1], such as 0.995; "
                         f"got {min_agreement!r}.")
    if quantize != "int8":
        raise ValueError(f"`min_agreement` (--min-agreement) applies to --quantize int8 only; got {quantize!r}.")
    needed = MIN_CALIBRATION_IMAGES + held_out_count(min_agreement)
    if calibration_size is None or calibration_size < needed:
        raise ValueError(
            f"`min_agreement`={min_agreement} needs `calibration_size` (--calibration-size) of at least {needed}: "
            f"{MIN_CALIBRATION_IMAGES} images to calibrate on and {held_out_count(min_agreement)} held out to "
            f"measure agreement on; got {calibration_size}.")


def split_held_out(images, min_agreement):
    """(calibration part, held-out part) of the calibration images, or ValueError if there are too few."""
    held = held_out_count(min_agreement)
    if len(images) < MIN_CALIBRATION_IMAGES + held:
        raise ValueError(f"`min_agreement`={min_agreement} needs at least {MIN_CALIBRATION_IMAGES + held} "
                         f"calibration images ({MIN_CALIBRATION_IMAGES} to calibrate on, {held} held out); "
                         f"`calibration` has {len(images)}.")
    return images[:-held], images[-held:]


def convert_fewest_float_ops(model, calibration, dynamic_batch, min_agreement, ranges="mse"):
    """int8 bytes with the fewest ops in float meeting ``min_agreement`` on a held-out part of ``calibration``
    (``sensitivity.fewest_float_ops``), and the rows the sweep tried."""
    calibration, held_out = split_held_out(calibration, min_agreement)
    model_bytes, rows = fewest_float_ops(model, calibration, held_out, min_agreement, dynamic_batch=dynamic_batch,
                                         ranges=ranges)
    check_builtin_ops(model_bytes, "int8")
    return bytes(model_bytes), rows


class Prober:
    """Quantizes one calibrated graph with a given set of float ops and measures the file against Keras."""

    def __init__(self, model, calibrated, images, folder, latency_runs=0):
        self.calibrated, self.images, self.latency_runs = calibrated, images, latency_runs
        self.reference = keras_scores(model, images)
        self.norms, self.nodes = norm_count(model), default_float_nodes(model, calibrated)
        self.path = os.path.join(folder, "probe.tflite")

    def quantize(self, float_ops):
        return explicit_transposes(quantize_int8(self.calibrated, float_ops, num_norms=self.norms,
                                                 float_nodes=self.nodes if float_ops else ()))

    def row(self, float_ops):
        """{float_ops, agreement, max_abs_diff, bytes, float_op_count[, latency_ms]} for ``float_ops``."""
        data = self.quantize(float_ops)
        with open(self.path, "wb") as f:
            f.write(data)
        scores = tflite_scores(self.path, self.images)
        row = {"float_ops": tuple(float_ops), "bytes": len(data),
               "agreement": float(np.mean(scores.argmax(-1) == self.reference.argmax(-1))),
               "max_abs_diff": float(np.abs(scores - self.reference).max()),
               "float_op_count": sum(op_precisions(self.path)[0].values())}
        if self.latency_runs:
            row["latency_ms"] = latency_ms(self.path, "interpreter", threads=2, runs=self.latency_runs)
        return row


def op_sensitivity(model, calibration, images, base=INT8_XNNPACK_FLOAT_OPS, candidates=CANDIDATES):
    """Rows {float_ops, agreement, max_abs_diff, bytes}: ``base`` alone, ``base`` + each candidate, the default."""
    calibrated = convert_graph(model, "int8", calibration_images(calibration, model))
    sets = [tuple(base)] + [tuple(base) + (op,) for op in candidates] + [INT8_FLOAT_OPS]
    with tempfile.TemporaryDirectory() as folder:
        prober = Prober(model, calibrated, images, folder)
        return [prober.row(float_ops) for float_ops in dict.fromkeys(sets)]


def fewest_float_ops(model, calibration, held_out, min_agreement, candidates=SWEEP_CANDIDATES, latency_runs=20,
                     dynamic_batch=False, ranges="mse"):
    """The int8 model with the smallest file, then the fewest ops in float, whose top-1 agreement with Keras on
    ``held_out`` (uint8 images the calibration never saw) is at least ``min_agreement``: (model bytes, the rows
    tried, the chosen one marked "chosen").

    Measures full int8 and the XNNPACK minimum (never chosen), then the default int8 file (``INT8_FLOAT_OPS``)
    and, if that falls short, ranks the candidate groups (op types, and dense roles) by what each alone adds to
    it and adds them in that order until the target is met. ValueError, with the rows, if even all of them fall
    short. Each row also has its size and 2-thread LiteRT latency (the trade-off).
    """
    calibrated = convert_graph(model, "int8", calibration, dynamic_batch, ranges=ranges)
    candidates = [group for group in candidates if in_graph(calibrated, group)]
    with tempfile.TemporaryDirectory() as folder:
        prober = Prober(model, calibrated, held_out, folder, latency_runs)
        rows = []

        def tried(float_ops):
            rows.append(prober.row(float_ops))
            return rows[-1]

        tried(())  # full int8 and the XNNPACK minimum, for the trade-off: full int8 runs 3-5x slower than float32,
        tried(tuple(INT8_XNNPACK_FLOAT_OPS))  # and the minimum was no faster than the default in the zoo
        base = tuple(INT8_FLOAT_OPS)
        default = tried(base)
        passing = [default] if default["agreement"] >= min_agreement else []
        if not passing:
            singles = {group: tried(base + group) for group in candidates}
            passing = [row for row in singles.values() if row["agreement"] >= min_agreement]
            ranked = sorted(candidates, key=lambda group: -singles[group]["agreement"])
            current = base + ranked[0]
            for group in ranked[1:] if not passing else ():
                current += group
                if tried(current)["agreement"] >= min_agreement:
                    passing = [rows[-1]]
                    break
        if passing:
            chosen = min(passing, key=lambda row: (size_step(row, default["bytes"]), row["float_op_count"],
                                                   -row["agreement"]))
            chosen["chosen"] = True
            return prober.quantize(chosen["float_ops"]), rows
    raise ValueError(f"no set of float ops reaches `min_agreement`={min_agreement} on {len(held_out)} held-out "
                     f"images (best {max(row['agreement'] for row in rows):.4f}); export float16 or dynamic "
                     "instead.\n" + format_sweep(rows))


def in_graph(calibrated, group):
    """Whether every dense role of a candidate group has layers in the graph (a model without pre-logits or
    sequence pooling has none of theirs, and keeping them in float would only repeat the default row)."""
    roles = split_float_ops(group)[1]
    return all(dense_role_nodes(calibrated, [role]) for role in roles)


def size_step(row, int8_bytes):
    """The row's size in steps of SAME_SIZE of ``int8_bytes`` (the default int8 file's): the sweep prefers a
    smaller step, then fewer float ops."""
    return round(row["bytes"] / (int8_bytes * SAME_SIZE))


def format_sweep(rows):
    """The sweep's trade-off as a Markdown table, the chosen row marked."""
    lines = ["| ops kept in float (besides the residual stream) | float ops | agreement | size KB | 2T ms |",
             "|---|---|---|---|---|"]
    for row in rows:
        mark = " **(chosen)**" if row.get("chosen") else ""
        names = ", ".join(row["float_ops"]) or "none (full int8)"
        latency = f"{row['latency_ms']:.3f}" if "latency_ms" in row else "-"
        lines.append(f"| {names}{mark} | {row['float_op_count']} | {100 * row['agreement']:.2f}% | "
                     f"{row['bytes'] / 1e3:.1f} | {latency} |")
    return "\n".join(lines)
