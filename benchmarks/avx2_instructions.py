"""int8 against float32 on an AVX2 CPU without VNNI, counted op by op: instructions under valgrind.

    .venv/bin/python benchmarks/export_latency.py --models ti16 --modes float32,int8 --workdir /tmp/lat \
        --runs 10 --rounds 1 --threads 1 --runtimes interpreter
    .venv/bin/python benchmarks/avx2_instructions.py /tmp/lat/ti16_float32.tflite /tmp/lat/ti16_int8.tflite

valgrind (3.19) runs x86-64 code on a CPU model of its own: CPUID reports AVX2 and FMA but neither AVX-512 nor
any VNNI, and XCR0 enables no AVX-512 state. XNNPACK asks the CPU what it has, so under valgrind LiteRT runs the
kernels an AVX2-only CPU such as AMD's Zen 3 runs (``xnn_f32_gemm_..._fma3``, ``xnn_qd8/qs8_..._avx2``), whatever
the host is. Callgrind counts the instructions each kernel executes inside one invoke (the difference between a
run of three invokes and a run of one, so that a first invoke's set-up drops out), grouped here
by the op family the kernel serves. Instructions are not cycles: a 256-bit FMA does 8 float multiply-adds, AVX2's
int8 dot product (``vpmaddubsw``/``vpmaddwd`` without VNNI) 16 to 32 int8 multiply-adds but needs widening and
accumulating instructions beside it. The counts say where each file spends its work and which ops int8 makes
cheaper or dearer on such a CPU; timing needs the CPU itself (benchmarks/export_latency.py).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

# (op family, pattern on the kernel's function name); the first match wins.
FAMILIES = (
    ("matrix products (FULLY_CONNECTED, BATCH_MATMUL, CONV)", r"_\w*(gemm|conv_hwc|dwconv)"),
    ("quantize, dequantize, requantize", r"xnn_\w*(vcvt|quantize)"),
    ("softmax", r"xnn_\w*(raddstoreexpminusmax|rmax|rminmax|vscale|softmax)"),
    ("GELU and other activations (int8: a lookup table)", r"xnn_\w*(vtanh|vgelu|verf|vsigmoid|vlrelu|vclamp|lut)"),
    ("LayerNorm reductions (MEAN, rsqrt)", r"xnn_\w*(rsum|rdsum|reduce|vrsqrt|vsqrt)"),
    ("element-wise (ADD, SUB, MUL)", r"xnn_\w*(vadd|vsub|vmul|vsqrdiff|vbinary|vopbinary|vdiv)"),
    ("layout (TRANSPOSE, copies, packing)", r"(transpose|xx_copy|pack|memcpy|memmove|memset|copy)"),
    ("TFLite kernels outside XNNPACK", r"tflite::"),
)
OTHER = "other (the runtime's own work)"
INVOKE = "tflite::Subgraph::Invoke()"  # only instructions inside it are counted
ANNOTATED = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*?)(?:\s+\[[^\]]*\])?\s*$")
DRIVER = """
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
interpreter = Interpreter(model_path=sys.argv[1], num_threads=1)
interpreter.allocate_tensors()
detail = interpreter.get_input_details()[0]
interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
for _ in range(int(sys.argv[2])):
    interpreter.invoke()
"""


def family(function):
    for name, pattern in FAMILIES:
        if re.search(pattern, function):
            return name
    return OTHER


def function_counts(driver, model_path, invokes, folder):
    """{function: instructions} for ``driver`` loading ``model_path`` and invoking it ``invokes`` times."""
    out = os.path.join(folder, f"callgrind.{invokes}.out")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"--toggle-collect={INVOKE}",
                    sys.executable, driver, model_path, str(invokes)], check=True, capture_output=True)
    report = subprocess.run(["callgrind_annotate", "--threshold=100", out], check=True, capture_output=True,
                            text=True).stdout
    counts = defaultdict(int)
    for line in report.split("PROGRAM TOTALS", 1)[-1].splitlines():
        match = ANNOTATED.match(line)
        if match and ":" in match.group(2):
            counts[match.group(2).split(":", 1)[1]] += int(match.group(1).replace(",", ""))
    return counts


def per_invoke(model_path):
    """{family: instructions of one invoke} and {kernel: instructions}, from runs of 1 and 3 invokes."""
    with tempfile.TemporaryDirectory() as folder:
        driver = os.path.join(folder, "driver.py")
        with open(driver, "w") as f:
            f.write(DRIVER)
        once, thrice = (function_counts(driver, model_path, invokes, folder) for invokes in (1, 3))
    kernels = {name: (thrice[name] - once.get(name, 0)) / 2 for name in thrice}
    families = defaultdict(float)
    for name, count in kernels.items():
        families[family(name)] += count
    return families, kernels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("float32", help="the float32 .tflite")
    parser.add_argument("int8", help="the int8 .tflite of the same model")
    parser.add_argument("--kernels", type=int, default=8, help="the busiest kernels of each file to list")
    args = parser.parse_args(argv)
    results = {mode: per_invoke(path) for mode, path in (("float32", args.float32), ("int8", args.int8))}
    families = [name for name, _ in FAMILIES] + [OTHER]
    print("| op family | float32 (M instructions) | int8 (M instructions) | int8 / float32 |")
    print("|---|---|---|---|")
    for name in families + ["all"]:
        f32, i8 = (sum(r[0].values()) if name == "all" else r[0].get(name, 0.0) for r in results.values())
        if f32 or i8:
            ratio = f"{i8 / f32:.2f}x" if f32 else "-"
            print(f"| {name} | {f32 / 1e6:,.1f} | {i8 / 1e6:,.1f} | {ratio} |")
    for mode, (_, kernels) in results.items():
        print(f"\n{mode}: the busiest kernels (M instructions an invoke)")
        for name, count in sorted(kernels.items(), key=lambda kv: -kv[1])[:args.kernels]:
            print(f"  {count / 1e6:9.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
