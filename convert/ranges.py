"""int8 activation ranges chosen for the least rounding error, not the calibration's min and max.

    from vit_keras.convert.ranges import mse_ranges
    calibrated = mse_ranges(calibrated, batches)   # before quantize_int8

The converter's calibration records each activation's min and max over the calibration images, and int8 spreads
its 256 levels over that range. One rare value far out stretches the step for all the others. Here each range is
the one whose 256 levels give the least mean squared error over the calibration images' values: the rounding
error inside the range plus the clipping error outside it (the "OMSE" range of the ViT quantization literature;
what it buys: docs/benchmarks.md#activation-ranges-least-squared-error-instead-of-minmax).
"""

import os

import numpy as np

from .flatbuffer import pack_model, unpack_model

BINS = 2048  # histogram bins over each activation's calibrated range
LEVELS = 255  # int8 steps across a range
SHRINK = np.linspace(1.0, 0.2, 41)  # candidate ends: the calibrated min and max times each of these


def best_range(counts, low, high):
    """(lo, hi) with the least expected squared error for int8 over a histogram of ``counts`` in equal bins from
    ``low`` to ``high``; candidates keep 0 inside the range, as int8's zero point must be a level.

    The error separates: clipping below lo, clipping above hi, and the rounding of the values between (a step
    squared over 12 each), so each end's clipping cost is computed once for its candidates."""
    centers = low + (np.arange(len(counts)) + 0.5) * (high - low) / len(counts)
    lows, highs = np.minimum(low, 0.0) * SHRINK, np.maximum(high, 0.0) * SHRINK
    below = np.clip(lows[:, None] - centers, 0, None)  # (candidates, bins): how far under each lo
    above = np.clip(centers - highs[:, None], 0, None)
    clip_low, clip_high = (below ** 2) @ counts, (above ** 2) @ counts
    inside = counts.sum() - (below > 0) @ counts  # per lo; less the values above hi, per hi:
    inside = inside[:, None] - ((above > 0) @ counts)[None, :]
    step = (highs[None, :] - lows[:, None]) / LEVELS
    cost = clip_low[:, None] + clip_high[None, :] + inside * step ** 2 / 12
    i, j = np.unravel_index(np.argmin(cost), cost.shape)
    return float(lows[i]), float(highs[j])


def activation_histograms(calibrated, batches, targets):
    """{tensor index: BINS counts over its calibrated [min, max]} of ``targets``' values over ``batches`` (float32
    batches of one image, as the calibrated graph takes them)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # Without XNNPACK: a delegate's inner tensors are not kept for reading.
    interpreter = Interpreter(model_content=bytes(calibrated), experimental_preserve_all_tensors=True,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                              num_threads=os.cpu_count())
    interpreter.allocate_tensors()
    feed = interpreter.get_input_details()[0]["index"]
    counts = {index: np.zeros(BINS, np.int64) for index in targets}
    for batch in batches:
        interpreter.set_tensor(feed, batch)
        interpreter.invoke()
        for index, (low, high) in targets.items():
            values = interpreter.get_tensor(index).ravel()
            bins = ((values - low) * (BINS / (high - low))).astype(np.int64)
            counts[index] += np.bincount(np.clip(bins, 0, BINS - 1), minlength=BINS)
    return counts


def mse_ranges(calibrated, batches):
    """``calibrated`` (the converter's calibrate-only output) with each activation's recorded range replaced by its
    least-squared-error int8 range over ``batches`` (float32 RGB raw pixels, (1, H, W, 3) each: what the
    calibration saw, as ``export.representative_dataset`` gives them). The graph's input and outputs keep theirs: the input carries raw pixels, the outputs are float."""
    model = unpack_model(calibrated)
    graph = model.subgraphs[0]
    ends = set(int(i) for i in graph.inputs) | set(int(i) for i in graph.outputs)
    targets = {}
    for index, tensor in enumerate(graph.tensors):
        stats = tensor.quantization
        if index in ends or stats is None or stats.min is None or stats.max is None or len(stats.min) != 1:
            continue
        low, high = min(float(stats.min[0]), 0.0), max(float(stats.max[0]), 0.0)
        if high > low:
            targets[index] = (low, high)
    for index, counts in activation_histograms(calibrated, batches, targets).items():
        low, high = best_range(counts, *targets[index])
        graph.tensors[index].quantization.min = np.array([low], np.float32)
        graph.tensors[index].quantization.max = np.array([high], np.float32)
    return pack_model(model, len(calibrated))
