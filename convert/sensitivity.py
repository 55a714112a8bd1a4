"""Per-op sensitivity of int8 quantization: which op types, kept in float, bring the int8 model back to Keras.

The ViT literature reports int8 collapses from LayerNorm, GELU and softmax outliers. This
sweep calibrates once, then quantizes the same calibrated graph with one more op type left
in float at a time, and measures top-1 agreement and the largest score error against Keras.
The residual stream and a conv stem stay in float in every row with float ops, as ``export`` keeps them
for any ``float_ops`` but (), so each row is the file ``export_tflite(float_ops=row["float_ops"])`` writes.

    from vit_keras.convert.sensitivity import op_sensitivity
    rows = op_sensitivity(model, calibration_images, test_images)
"""

import os
import tempfile

import numpy as np

from .export import (INT8_FLOAT_OPS, INT8_XNNPACK_FLOAT_OPS, calibration_images, convert_graph, default_float_nodes,
                     quantize_int8)
from .graph import keras_scores, norm_count
from .verify import predict

CANDIDATES = ("CONV_2D", "FULLY_CONNECTED", "ADD", "MEAN", "SUB", "MUL", "CONCATENATION")


def op_sensitivity(model, calibration, images, base=INT8_XNNPACK_FLOAT_OPS, candidates=CANDIDATES):
    """Rows {float_ops, agreement, max_abs_diff, bytes}: ``base`` alone, ``base`` + each candidate, the default."""
    reference = keras_scores(model, images)
    calibrated = convert_graph(model, "int8", calibration_images(calibration, model))
    norms, nodes = norm_count(model), default_float_nodes(model, calibrated)
    sets = [tuple(base)] + [tuple(base) + (op,) for op in candidates] + [INT8_FLOAT_OPS]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.tflite")
        for float_ops in dict.fromkeys(sets):
            data = quantize_int8(calibrated, float_ops, num_norms=norms, float_nodes=nodes if float_ops else ())
            with open(path, "wb") as f:
                f.write(data)
            scores = predict(path, images)
            rows.append({"float_ops": float_ops, "bytes": len(data),
                         "agreement": float(np.mean(scores.argmax(-1) == reference.argmax(-1))),
                         "max_abs_diff": float(np.abs(scores - reference).max())})
    return rows
