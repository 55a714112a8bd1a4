"""The classifier runtime: a .tflite run by LiteRT with NumPy and Pillow, configured by its own metadata.

No TensorFlow and no vit_keras here: this is what a device runs. Everything the model needs (labels,
normalization, image size, channels, input quantization) comes from the file:

- float inputs (float32 / float16 / dynamic-range exports) get (pixel - mean) / std from the
  normalization metadata, one value or one a channel (raw 0-255 pixels when a file has none, or mean 0,
  std 1: the graph then normalizes itself, as for a model normalized per channel);
- uint8 inputs (int8 exports) get raw pixels, as MediaPipe and Android feed them; int8 inputs get the
  normalized value quantized with the tensor's scale and zero point;
- the image is resized to the input tensor's size and converted to its channel count (1 or 3).
"""

import os
import queue
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vit_keras.constants import RUNTIMES

from .attention import attention_heatmap
from .images import load_image
from .model_info import read_model_info


@dataclass
class Prediction:
    path: str
    top: list  # [(label, score)] best first
    inference_ms: float
    total_ms: float
    image: Image.Image  # the decoded image, before resizing to the model
    attention: np.ndarray | None = None  # (grid_h, grid_w) in [0, 1] when the model exports attention


def fit_image(image, width, height, channels):
    """An 8-bit 'RGB'/'L' PIL image as a model's input pixels: uint8 (height, width, channels), converted to the
    channel count and resized (bilinear). The .tflite and the .keras paths of `vit-keras classify` share it."""
    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    if image.size != (width, height):
        image = image.resize((width, height), Image.BILINEAR, reducing_gap=3.0)
    return np.asarray(image, dtype=np.uint8).reshape(height, width, channels)


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _load_interpreter(path, threads):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_path=path, num_threads=threads)


def read_buffer(buffer, detail):
    """A CompiledModel output buffer as an array of ``detail``'s dtype and shape. ai-edge-litert 2.3.0 reads no
    int16 (the npu target's scores), so such a buffer is read as its bytes and viewed as the dtype."""
    dtype, count = np.dtype(detail["dtype"]), int(np.prod(detail["shape"]))
    if dtype == np.int16:
        return buffer.read(count * dtype.itemsize, np.uint8).view(dtype).reshape(detail["shape"])
    return buffer.read(count, dtype).reshape(detail["shape"])


class Classifier:
    """Load once, classify many. Thread-safe: a small pool of interpreters serves concurrent calls."""

    def __init__(self, model_path, threads=None, workers=1, runtime="interpreter"):
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}; got {runtime!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1; got {workers}")
        self.path = os.fspath(model_path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no such model file: {self.path}")
        with open(self.path, "rb") as f:
            data = f.read()
        try:
            self.info = read_model_info(data)
        except Exception as error:  # a damaged flatbuffer fails in many ways (struct.error, IndexError, ...)
            raise ValueError(f"{os.path.basename(self.path)} is not a usable .tflite model: {error}") from None
        self.threads = threads or min(4, os.cpu_count() or 1)
        self.runtime = runtime
        first = self._make_runner()
        self._describe(first)
        if threads is None and self.threads > 1:
            first = self._faster_runner(first)
        self._pool = queue.Queue()
        self._pool.put(first)
        for _ in range(workers - 1):
            self._pool.put(self._make_runner())
        # One run now, so the first user request does not pay for XNNPACK's lazy set-up.
        self._run(np.zeros((1, self.height, self.width, self.channels), self.input_dtype))

    # ----- model set-up -----------------------------------------------------------------------------
    def _make_runner(self):
        try:
            interpreter = _load_interpreter(self.path, self.threads)
            detail = interpreter.get_input_details()[0]
            if -1 in list(detail["shape_signature"][:1]) or detail["shape"][0] != 1:
                interpreter.resize_tensor_input(detail["index"], [1, *detail["shape"][1:]])
            interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as error:
            raise ValueError(f"{os.path.basename(self.path)} could not be loaded by LiteRT: {error}") from None
        if self.runtime == "compiled":
            from ai_edge_litert.compiled_model import CompiledModel
            from ai_edge_litert.options import CpuOptions, Options

            compiled = CompiledModel.from_file(self.path, options=Options(cpu_options=CpuOptions(
                num_threads=self.threads)))
            # CompiledModel lists outputs in signature order; map them to the interpreter's output details.
            details = interpreter.get_output_details()
            return interpreter, (compiled, compiled.create_input_buffers(0), compiled.create_output_buffers(0), details)
        return interpreter, None

    def _faster_runner(self, runner, budget_s=0.5):
        """``runner`` (a thread pool) or a single-threaded one, whichever invokes faster; sets ``self.threads``.

        A small model can lose more to the thread pool than it gains, while a large one gains from every core
        (docs/runtimes.md has the figures).
        """
        batch = np.zeros((1, self.height, self.width, self.channels), self.input_dtype)
        pool_threads, self.threads = self.threads, 1
        single = self._make_runner()
        self._invoke(runner, batch)  # XNNPACK sets up lazily, on the first run
        start = time.perf_counter()
        self._invoke(single, batch)
        runs = int(min(20, max(3, budget_s / 2 / max(time.perf_counter() - start, 1e-6))))
        median_ms = {}
        for name, candidate in (("pool", runner), ("single", single)):
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                self._invoke(candidate, batch)
                times.append(time.perf_counter() - start)
            median_ms[name] = sorted(times)[len(times) // 2]
        if median_ms["single"] < median_ms["pool"]:
            return single
        self.threads = pool_threads
        return runner

    def _describe(self, runner):
        interpreter = runner[0]
        inputs = interpreter.get_input_details()
        if len(inputs) != 1 or len(inputs[0]["shape"]) != 4 or inputs[0]["shape"][-1] not in (1, 3):
            shapes = [list(d["shape"]) for d in inputs]
            raise ValueError(f"{os.path.basename(self.path)} is not an image classifier: "
                             f"expected one (1, H, W, 1|3) input, got {shapes}")
        self.input = inputs[0]
        _, self.height, self.width, self.channels = (int(v) for v in self.input["shape"])
        self.input_dtype = np.dtype(self.input["dtype"])
        outputs = interpreter.get_output_details()
        num_labels = len(self.info.labels)
        scores = [d for d in outputs if len(d["shape"]) == 2 and (not num_labels or d["shape"][-1] == num_labels)]
        if not scores:
            raise ValueError(f"{os.path.basename(self.path)} has no (1, num_classes) scores output "
                             f"matching its {num_labels} labels")
        self.scores_output = scores[0]
        self.attention_outputs = [d for d in outputs if d is not self.scores_output]
        self.num_classes = int(self.scores_output["shape"][-1])
        if not self.info.labels:
            self.info.labels = [f"class {i}" for i in range(self.num_classes)]
        self.mean = np.asarray(self.info.mean if self.info.mean else [0.0], np.float32)
        self.std = np.asarray(self.info.std if self.info.std else [1.0], np.float32)
        # One value, or one a channel (per-channel metadata from other tools; vit-keras folds those into the graph)
        for key, values in (("mean", self.mean), ("std", self.std)):
            if values.ndim != 1 or values.size not in (1, self.channels):
                raise ValueError(f"{os.path.basename(self.path)}: its normalization {key} has {values.size} values; "
                                 f"a {self.channels}-channel input takes 1 or {self.channels}")
        if not np.all(self.std > 0):
            raise ValueError(f"{os.path.basename(self.path)}: its normalization std must be > 0; "
                             f"got {self.std.tolist()}")

    @property
    def name(self):
        return self.info.name or os.path.splitext(os.path.basename(self.path))[0]

    @property
    def has_attention(self):
        return bool(self.attention_outputs)

    # ----- inference ----------------------------------------------------------------------------------
    def preprocess(self, image):
        """8-bit 'RGB'/'L' PIL image -> the (1, H, W, C) input tensor."""
        pixels = fit_image(image, self.width, self.height, self.channels)[None]
        if self.input_dtype == np.uint8:
            return pixels  # raw pixels, as MediaPipe / Android feed a uint8 model
        normalized = (pixels.astype(np.float32) - self.mean) / self.std
        if self.input_dtype == np.int8:
            scale, zero = self.input["quantization"]
            return np.clip(np.round(normalized / scale + zero), -128, 127).astype(np.int8)
        return normalized.astype(self.input_dtype)

    def _run(self, batch):
        runner = self._pool.get()
        try:
            return self._invoke(runner, batch)
        finally:
            self._pool.put(runner)

    def _invoke(self, runner, batch):
        """Run one batch on one runner: the raw scores output, then any attention outputs."""
        interpreter, compiled = runner
        if compiled is None:
            interpreter.set_tensor(self.input["index"], batch)
            interpreter.invoke()
            return [interpreter.get_tensor(self.scores_output["index"])] + [
                interpreter.get_tensor(d["index"]) for d in self.attention_outputs]
        model, inputs, outputs, details = compiled
        inputs[0].write(batch)
        model.run_by_index(0, inputs, outputs)
        by_index = {d["index"]: i for i, d in enumerate(details)}
        arrays = [read_buffer(outputs[by_index[d["index"]]], d) for d in details]
        ordered = [self.scores_output] + self.attention_outputs
        return [arrays[by_index[d["index"]]] for d in ordered]

    @staticmethod
    def _dequantize(array, detail):
        scale, zero = detail["quantization"]
        if array.dtype.kind in "iu" and scale:
            return (array.astype(np.float32) - zero) * scale
        return array.astype(np.float32)

    def scores(self, raw):
        """Probabilities: a softmax unless the output already is a distribution."""
        scores = self._dequantize(raw, self.scores_output).reshape(-1)
        if scores.min() >= 0 and abs(float(scores.sum()) - 1.0) < 1e-2:
            return scores
        return _softmax(scores.astype(np.float64)).astype(np.float32)

    def classify_image(self, image, top_k=5, path=""):
        """Classify a decoded 8-bit PIL image."""
        start = time.perf_counter()
        batch = self.preprocess(image)
        infer_start = time.perf_counter()
        raw = self._run(batch)
        inference_ms = (time.perf_counter() - infer_start) * 1000
        probabilities = self.scores(raw[0])
        order = np.argsort(-probabilities, kind="stable")[:max(1, top_k)]
        top = [(self.info.labels[i] if i < len(self.info.labels) else f"class {i}", float(probabilities[i]))
               for i in order]
        attention = None
        if self.attention_outputs:
            maps = [self._dequantize(a, d) for a, d in zip(raw[1:], self.attention_outputs)]
            try:
                attention = attention_heatmap(maps)
            except ValueError:  # outputs that do not lay out on a square grid: classify without the overlay
                attention = None
        total_ms = (time.perf_counter() - start) * 1000
        return Prediction(path, top, inference_ms, total_ms, image, attention)

    def classify(self, path, top_k=5):
        """Decode a file (robustly) and classify it; raises ImageError with a clear message."""
        start = time.perf_counter()
        image, _ = load_image(path, target_size=(self.width, self.height))
        prediction = self.classify_image(image, top_k, path=os.fspath(path))
        prediction.total_ms = (time.perf_counter() - start) * 1000
        return prediction
