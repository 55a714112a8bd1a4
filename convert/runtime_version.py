"""The oldest TFLite runtime that runs a .tflite file, from the versions of the ops it holds.

Every builtin op in a flatbuffer carries a version; a runtime runs the file only if it has a kernel for each
(op, version), else it refuses to load it ("Didn't find op for builtin opcode 'FULLY_CONNECTED' version '12'").
OP_RELEASES says in which TensorFlow / TFLite release each version of the ops vit-keras exports first ran. Its
facts are those of TFLite's own op-version registry, tensorflow/lite/tools/versioning/runtime_version.cc
(``FindMinimumRuntimeVersionForOp``; google-ai-edge/LiteRT keeps it at tflite/tools/versioning/), restated here
for our ops only: an op or version not listed gets "unknown", never a guess.

    required_runtime("model.tflite")  # {"version": "2.9.0", "limiting": ["GELU v1"], "unknown": []}
"""

from vit_keras.constants import COMPAT_RUNTIMES

from .flatbuffer import builtin_name, read_model

# op -> the release that first ran version 1, 2, ... of it.
OP_RELEASES = {
    "ADD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0", "2.13.0"),
    "BATCH_MATMUL": ("2.3.0", "2.3.0", "2.4.0", "2.5.0"),
    "CONCATENATION": ("1.5.0", "1.14.0", "2.3.0", "2.14.0"),
    "CONV_2D": ("1.5.0", "1.14.0", "1.14.0", "2.3.0", "2.4.0", "2.9.0", "2.11.0", "2.15.0"),
    "DEQUANTIZE": ("1.13.1", "1.14.0", "1.15.0", "2.2.0", "2.7.0", "2.18.0"),
    "FULLY_CONNECTED": ("1.5.0", "1.10.0", "1.14.0", "1.14.0", "2.0.0", "2.1.0", "2.3.0", "2.3.0", "2.3.0",
                        "2.11.0", "2.15.0", "2.17.0", "2.18.0"),
    "GELU": ("2.9.0", "2.9.0"),
    "MAX_POOL_2D": ("1.5.0", "1.14.0", "2.3.0"),
    "MAXIMUM": ("1.14.0", "1.14.0", "2.3.0", "2.3.0"),
    "MEAN": ("1.6.0", "1.14.0", "2.4.0"),
    "MINIMUM": ("1.14.0", "1.14.0", "2.3.0"),
    "MUL": ("1.5.0", "1.14.0", "1.15.0", "2.3.0", "2.6.0", "2.11.0", "2.13.0"),
    "PAD": ("1.5.0", "1.14.0", "2.4.0", "2.6.0"),
    "QUANTIZE": ("1.14.0", "1.15.0", "2.7.0"),
    "RELU": ("1.5.0", "2.1.0", "2.5.0"),
    "RESHAPE": ("1.5.0",),
    "RSQRT": ("1.10.0", "2.5.0", "2.15.0"),
    "SLICE": ("1.14.0", "1.14.0", "1.14.0", "2.4.0", "2.5.0", "2.14.0"),
    "SOFTMAX": ("1.5.0", "1.14.0", "2.3.0"),
    "SPLIT": ("1.5.0", "1.14.0", "1.14.0", "2.3.0"),
    "STRIDED_SLICE": ("1.6.0", "1.14.0", "2.1.0", "2.2.0", "2.5.0", "2.6.0", "2.14.0", "2.14.0"),
    "SUB": ("1.6.0", "1.14.0", "2.3.0", "2.4.0", "2.4.0"),
    "TANH": ("1.14.0", "1.14.0", "2.3.0"),
    "TRANSPOSE": ("1.6.0", "1.14.0", "1.15.0", "2.3.0", "2.4.0", "2.12.0", "2.14.4"),
}


def version_key(version):
    """"2.14.4" -> (2, 14, 4), for comparing releases."""
    return tuple(int(part) for part in version.split("."))


def op_versions(model_bytes):
    """{(op name, version)} of every op in a .tflite flatbuffer (custom ops as ("CUSTOM:name", version))."""
    try:
        model = read_model(model_bytes)
        used = set()
        for s in range(model.SubgraphsLength()):
            graph = model.Subgraphs(s)
            for i in range(graph.OperatorsLength()):
                code = model.OperatorCodes(graph.Operators(i).OpcodeIndex())
                name = builtin_name(code)
                if name == "CUSTOM":
                    name = "CUSTOM:" + (code.CustomCode() or b"?").decode("utf-8", "replace")
                used.add((name, int(code.Version())))
    except Exception as error:  # a truncated or corrupt flatbuffer fails anywhere in the generated reader
        raise ValueError(f"not a readable TFLite model: {type(error).__name__}: {error}") from None
    return used


def required_runtime(model):
    """The oldest TFLite runtime that runs ``model`` (a .tflite path or its bytes), from its op versions:
    {"version": "2.9.0", or None where some op version is unknown, "limiting": the ops that need that version,
    "unknown": the ops and versions OP_RELEASES does not know}."""
    from .metadata import read_flatbuffer

    data = model if isinstance(model, (bytes, bytearray)) else read_flatbuffer(model)
    known, unknown = {}, []
    for op, version in sorted(op_versions(bytes(data))):
        releases = OP_RELEASES.get(op, ())
        if 1 <= version <= len(releases):
            known[f"{op} v{version}"] = releases[version - 1]
        else:
            unknown.append(f"{op} v{version}")
    newest = max(known.values(), key=version_key, default="1.5.0")
    limiting = [name for name, release in known.items() if release == newest]
    return {"version": None if unknown else newest, "limiting": limiting, "unknown": unknown}


def runtime_packages(version):
    """The pip packages whose kernels run TFLite ``version`` files, e.g. "tflite-runtime >= 2.9.0, ai-edge-litert
    >= 1.0.1" (COMPAT_RUNTIMES: each package's release and the TFLite version it carries)."""
    packages = []
    for package, release, carries, _ in COMPAT_RUNTIMES:
        if version_key(version) <= version_key(carries):
            # tflite-runtime's releases are numbered as TensorFlow's: its oldest that runs the file is that version
            packages.append(f"{package} >= {version if package == 'tflite-runtime' else release}")
    return ", ".join(packages) or f"a LiteRT release after TFLite {version} (none of {describe_packages()})"


def describe_packages():
    return ", ".join(f"{package} {release}" for package, release, _, _ in COMPAT_RUNTIMES)


def describe(requirement):
    """One line for people: "TFLite >= 2.9.0 (tflite-runtime >= 2.9.0, ai-edge-litert >= 1.0.1)", or why unknown."""
    if requirement["version"] is None:
        return "unknown: no release known for " + ", ".join(requirement["unknown"])
    return f"TFLite >= {requirement['version']} ({runtime_packages(requirement['version'])})"


def runs_under(requirement, carries):
    """True where a runtime carrying TFLite ``carries`` runs the file, False where too old, None if unknown."""
    if requirement["version"] is None:
        return None
    return version_key(requirement["version"]) <= version_key(carries)
