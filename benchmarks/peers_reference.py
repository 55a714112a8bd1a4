"""The peers of `benchmarks/peers.py`, in an interpreter that has them: timm eager, torch.compile, ONNX Runtime
(float32, dynamic int8) and OpenVINO (float32, its default precision) on one timm model, served to the caller so
that it can time them in turns with its own paths (a shared CPU drifts over minutes).

    /work/.venv-ref/bin/python benchmarks/peers_reference.py vit_tiny_patch16_224 --out DIR [--weights W.safetensors]
        [--photos PHOTOS.npy]

Writes DIR/model.safetensors, the timm state dict every runtime ran (seeded random weights, or --weights), so
the caller runs the same weights; compiles and warms every peer, then prints one JSON line (the peers, versions,
agreements) and answers each line read from stdin, a peer's name, with one JSON line: the seconds one batch of
--batch-size took through it. --photos: uint8 (N, 224, 224, 3) images, normalized with mean = std = 0.5; each
peer's top-1 agreement with timm eager float32 on them is reported. Needs torch, timm, onnx, onnxruntime,
openvino (a benchmark-only venv: docs/benchmarks.md#peers); imports nothing of vit_keras; never run by CI.
"""

import argparse
import json
import os
import sys
import time


def seconds(run, images):
    start = time.perf_counter()
    run(images)
    return time.perf_counter() - start


def build(name, weights, out):
    import timm
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    if weights:
        model.load_state_dict(load_file(weights))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"))
    return model


def runtimes(model, out, batch):
    """{peer: a function of a float32 NCHW NumPy batch -> logits}."""
    import numpy as np
    import onnxruntime
    import openvino
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx_path, int8_path = os.path.join(out, "model.onnx"), os.path.join(out, "model.int8.onnx")
    example = torch.zeros(batch, 3, 224, 224)
    torch.onnx.export(model, (example,), onnx_path, input_names=["images"], output_names=["logits"],
                      dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    quantize_dynamic(onnx_path, int8_path, weight_type=QuantType.QInt8)
    compiled = torch.compile(model)

    def torch_run(module):
        def run(x):
            with torch.inference_mode():
                return module(torch.from_numpy(x)).numpy()
        return run

    def ort_run(path):
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"images": x})[0]

    core = openvino.Core()

    def openvino_run(config):
        request = core.compile_model(onnx_path, "CPU", config).create_infer_request()
        return lambda x: np.asarray(request.infer({0: x})[0])

    default = core.compile_model(onnx_path, "CPU")
    return {"timm eager": torch_run(model), "torch.compile": torch_run(compiled),
            "ONNX Runtime float32": ort_run(onnx_path), "ONNX Runtime int8 (dynamic)": ort_run(int8_path),
            "OpenVINO float32": openvino_run({"INFERENCE_PRECISION_HINT": "f32"}),
            "OpenVINO default": openvino_run({})}, str(default.get_property("INFERENCE_PRECISION_HINT"))


def agreements(runs, photos, batch):
    """Each peer's top-1 agreement with timm eager float32 on ``photos`` (uint8 NHWC)."""
    import numpy as np

    def top1(run):
        out = []
        for i in range(0, len(photos), batch):
            x = photos[i:i + batch].transpose(0, 3, 1, 2).astype("float32") / 127.5 - 1.0
            out.append(run(np.ascontiguousarray(x)).argmax(-1))
        return np.concatenate(out)

    reference = top1(runs["timm eager"])
    return {peer: float(np.mean(top1(run) == reference)) for peer, run in runs.items()}, reference.tolist()


def main():
    here = os.path.dirname(os.path.abspath(__file__))  # run by path: this folder must not shadow torch's modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import numpy as np
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--out", required=True)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--photos", default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    model = build(args.name, args.weights, args.out)
    runs, openvino_default = runtimes(model, args.out, args.batch_size)
    images = np.random.default_rng(0).normal(size=(args.batch_size, 3, 224, 224)).astype("float32")
    for run in runs.values():  # compiled and warm before the first timed call
        run(images)
        run(images)
    ready = {"peers": list(runs), "openvino_default_precision": openvino_default, "torch": torch.__version__,
             "threads": torch.get_num_threads()}
    if args.photos:
        ready["agreement"], ready["top1"] = agreements(runs, np.load(args.photos), args.batch_size)
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        print(json.dumps(seconds(runs[line.strip()], images)), flush=True)


if __name__ == "__main__":
    main()
