"""TFLite model metadata, written and read with the `flatbuffers` package alone (no TensorFlow).

Why our own builder: the published metadata schema (tflite/metadata_schema.fbs,
file identifier "M001") is the contract Android's and MediaPipe's runtimes read,
but none of the packages that generate it work in this environment:
tflite-support 0.4.4 pins an old protobuf that breaks TensorFlow 2.21;
mediapipe 1.2.3's ``metadata_writers`` fails to import (a compiled module is missing
from the wheel) and importing any ``mediapipe`` module pulls in TensorFlow; ai-edge-litert
has no metadata writer. So ``SCHEMA`` below mirrors the subset of the .fbs we use,
field by field in slot order, and drives both a builder and a reader. The model
flatbuffer itself is edited with ai-edge-litert's generated ``schema_py_generated``.

Layout of an exported file, as ``MetadataPopulator`` makes it:
  [TFLite model with buffer "TFLITE_METADATA"] + [zip of the associated files, stored]
The app imports this module to read labels and normalization; keep it free of TensorFlow.
"""

import io
import zipfile

import flatbuffers
import numpy as np
from flatbuffers import number_types, table

METADATA_NAME = "TFLITE_METADATA"
# The converter's own entry in the model's metadata list: the oldest TFLite runtime version that runs the file, as
# a 16-byte NUL-padded string (export writes ours there: convert/runtime_version.py).
RUNTIME_VERSION_NAME = "min_runtime_version"
RUNTIME_VERSION_BYTES = 16
METADATA_IDENTIFIER = b"M001"
MODEL_IDENTIFIER = b"TFL3"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the associated files' date: the earliest a zip entry records

ENUMS = {
    "AssociatedFileType": ["UNKNOWN", "DESCRIPTIONS", "TENSOR_AXIS_LABELS", "TENSOR_VALUE_LABELS",
                           "TENSOR_AXIS_SCORE_CALIBRATION", "VOCABULARY", "SCANN_INDEX_FILE"],
    "ColorSpaceType": ["UNKNOWN", "RGB", "GRAYSCALE"],
}
UNIONS = {
    "ContentProperties": ["NONE", "FeatureProperties", "ImageProperties", "BoundingBoxProperties", "AudioProperties"],
    "ProcessUnitOptions": ["NONE", "NormalizationOptions", "ScoreCalibrationOptions", "ScoreThresholdingOptions",
                           "BertTokenizerOptions", "SentencePieceTokenizerOptions", "RegexTokenizerOptions"],
}
# table -> fields in schema order. A union takes two slots (type, value). Trailing fields we never
# write are left out; leading ones must all be listed so the slots line up with the .fbs.
SCHEMA = {
    "AssociatedFile": [("name", "string"), ("description", "string"), ("type", "enum:AssociatedFileType"),
                       ("locale", "string"), ("version", "string")],
    "FeatureProperties": [],
    "ImageSize": [("width", "uint"), ("height", "uint")],
    "ImageProperties": [("color_space", "enum:ColorSpaceType"), ("default_size", "ImageSize")],
    "ValueRange": [("min", "int"), ("max", "int")],
    "Content": [("content_properties", "union:ContentProperties"), ("range", "ValueRange")],
    "NormalizationOptions": [("mean", "[float]"), ("std", "[float]")],
    "ProcessUnit": [("options", "union:ProcessUnitOptions")],
    "Stats": [("max", "[float]"), ("min", "[float]")],
    "TensorMetadata": [("name", "string"), ("description", "string"), ("dimension_names", "[string]"),
                       ("content", "Content"), ("process_units", "[ProcessUnit]"), ("stats", "Stats"),
                       ("associated_files", "[AssociatedFile]")],
    "SubGraphMetadata": [("name", "string"), ("description", "string"),
                         ("input_tensor_metadata", "[TensorMetadata]"), ("output_tensor_metadata", "[TensorMetadata]"),
                         ("associated_files", "[AssociatedFile]"), ("input_process_units", "[ProcessUnit]"),
                         ("output_process_units", "[ProcessUnit]")],
    "ModelMetadata": [("name", "string"), ("description", "string"), ("version", "string"),
                      ("subgraph_metadata", "[SubGraphMetadata]"), ("author", "string"), ("license", "string"),
                      ("associated_files", "[AssociatedFile]"), ("min_parser_version", "string")],
}
SCALARS = {"uint": number_types.Uint32Flags, "int": number_types.Int32Flags, "float": number_types.Float32Flags}


def _slots(table_name):
    slot = 0
    for name, kind in SCHEMA[table_name]:
        yield name, kind, slot
        slot += 2 if kind.startswith("union:") else 1


# ---------------------------------------------------------------- building
def _build(builder, table_name, values):
    unknown = set(values) - {name for name, _ in SCHEMA[table_name]} - {
        name + "_type" for name, kind in SCHEMA[table_name] if kind.startswith("union:")}
    if unknown:
        raise ValueError(f"metadata table {table_name} has no field(s) {sorted(unknown)}.")
    offsets = {}  # children first: flatbuffers builds bottom-up
    for name, kind, _ in _slots(table_name):
        value = values.get(name)
        if value is None or kind.startswith("enum:") or kind in SCALARS:
            continue
        if kind == "string":
            offsets[name] = builder.CreateString(value)
        elif kind.startswith("union:"):
            offsets[name] = _build(builder, values[name + "_type"], value)
        elif kind == "[float]":
            offsets[name] = builder.CreateNumpyVector(np.asarray(value, dtype="<f4"))
        elif kind == "[string]":
            offsets[name] = _vector(builder, [builder.CreateString(v) for v in value])
        elif kind.startswith("["):
            offsets[name] = _vector(builder, [_build(builder, kind[1:-1], v) for v in value])
        else:
            offsets[name] = _build(builder, kind, value)
    fields = list(_slots(table_name))
    builder.StartObject(fields[-1][2] + (2 if fields[-1][1].startswith("union:") else 1) if fields else 0)
    for name, kind, slot in fields:
        value = values.get(name)
        if value is None:
            continue
        if kind.startswith("enum:"):
            builder.PrependInt8Slot(slot, ENUMS[kind[5:]].index(value), 0)
        elif kind in SCALARS:
            flags = SCALARS[kind]
            builder.PrependSlot(flags, slot, value, 0)
        elif kind.startswith("union:"):
            builder.PrependUint8Slot(slot, UNIONS[kind[6:]].index(values[name + "_type"]), 0)
            builder.PrependUOffsetTRelativeSlot(slot + 1, offsets[name], 0)
        else:
            builder.PrependUOffsetTRelativeSlot(slot, offsets[name], 0)
    return builder.EndObject()


def _vector(builder, offsets):
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def min_parser_version(metadata):
    """The smallest metadata parser version that understands every field set (the schema's "Added in" notes)."""
    version = (1, 0, 0)
    for file in _associated_files(metadata):
        if file.get("type") == "VOCABULARY":
            version = max(version, (1, 0, 1))
        if file.get("version") is not None:
            version = max(version, (1, 4, 1))
    for subgraph in metadata.get("subgraph_metadata", []):
        if subgraph.get("input_process_units") or subgraph.get("output_process_units"):
            version = max(version, (1, 1, 0))
    return ".".join(map(str, version))


def _associated_files(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "associated_files":
                yield from value
            else:
                yield from _associated_files(value)
    elif isinstance(node, list):
        for value in node:
            yield from _associated_files(value)


def metadata_buffer(metadata):
    """A ModelMetadata dict (field names as in the .fbs) -> the "M001" flatbuffer bytes."""
    metadata = dict(metadata, min_parser_version=min_parser_version(metadata))
    builder = flatbuffers.Builder(1024)
    builder.Finish(_build(builder, "ModelMetadata", metadata), file_identifier=METADATA_IDENTIFIER)
    return bytes(builder.Output())


def unpack_model(model_bytes):
    """A .tflite flatbuffer as the schema's object API (``ModelT``), to edit its tensors, ops and buffers."""
    from ai_edge_litert import schema_py_generated as schema

    return schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)


def pack_model(model, size_hint=1024):
    """A ``ModelT`` back to .tflite bytes, with the model file identifier; ``size_hint``: the builder's first size."""
    builder = flatbuffers.Builder(size_hint)
    builder.Finish(model.Pack(builder), file_identifier=MODEL_IDENTIFIER)
    return bytes(builder.Output())


def set_model_metadata(model, name, data):
    """The ``name`` entry of an unpacked model's (``ModelT``) metadata list set to ``data`` bytes, made if missing."""
    from ai_edge_litert import schema_py_generated as schema

    buffer = schema.BufferT()
    buffer.data = np.frombuffer(data, dtype=np.uint8)
    model.buffers = (model.buffers or []) + [buffer]
    entry = next((e for e in model.metadata or [] if e.name in (name, name.encode())), None)
    if entry is None:
        entry = schema.MetadataT()
        entry.name = name
        model.metadata = (model.metadata or []) + [entry]
    entry.buffer = len(model.buffers) - 1


def populate(model_bytes, metadata, associated_files, min_runtime_version=None):
    """The model with ``metadata`` in its "TFLITE_METADATA" buffer and ``associated_files`` (name -> bytes) zipped
    after it.

    min_runtime_version: a TFLite version string ("2.9.0") for the model's own "min_runtime_version" entry."""
    if _find_metadata_buffer(model_bytes) is not None:
        raise ValueError("the model already carries TFLite metadata; populate a fresh conversion.")
    model = unpack_model(model_bytes)
    set_model_metadata(model, METADATA_NAME, metadata_buffer(metadata))
    if min_runtime_version is not None:
        version = min_runtime_version.encode("ascii")
        if len(version) >= RUNTIME_VERSION_BYTES:
            raise ValueError(f"`min_runtime_version` {min_runtime_version!r} is longer than the entry holds.")
        set_model_metadata(model, RUNTIME_VERSION_NAME, version.ljust(RUNTIME_VERSION_BYTES, b"\0"))
    out = io.BytesIO(pack_model(model, len(model_bytes) + 4096))
    out.seek(0, io.SEEK_END)
    # Appending to a non-zip file writes a zip whose offsets count from the file start, as MediaPipe reads it.
    with zipfile.ZipFile(out, "a", compression=zipfile.ZIP_STORED) as archive:
        for name, data in associated_files.items():  # a fixed date: the same model exports to the same bytes
            entry = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data)
    return out.getvalue()


# ---------------------------------------------------------------- reading
def _read(tab, table_name):
    result = {}
    for name, kind, slot in _slots(table_name):
        o = tab.Offset(4 + 2 * slot)
        if kind.startswith("union:"):
            type_offset, o = o, tab.Offset(4 + 2 * (slot + 1))
            if not type_offset or not o:
                continue
            member = UNIONS[kind[6:]][tab.Get(number_types.Uint8Flags, type_offset + tab.Pos)]
            result[name + "_type"] = member
            sub = table.Table(tab.Bytes, tab.Indirect(o + tab.Pos))
            result[name] = _read(sub, member) if member in SCHEMA else {}
            continue
        if not o:
            continue
        if kind == "string":
            result[name] = tab.String(o + tab.Pos).decode("utf-8")
        elif kind.startswith("enum:"):
            result[name] = ENUMS[kind[5:]][tab.Get(number_types.Int8Flags, o + tab.Pos)]
        elif kind in SCALARS:
            result[name] = tab.Get(SCALARS[kind], o + tab.Pos)
        elif kind.startswith("["):
            start, count, item = tab.Vector(o), tab.VectorLen(o), kind[1:-1]
            if item == "float":
                result[name] = [float(tab.Get(number_types.Float32Flags, start + 4 * i)) for i in range(count)]
            elif item == "string":
                result[name] = [tab.String(start + 4 * i).decode("utf-8") for i in range(count)]
            else:
                result[name] = [_read(table.Table(tab.Bytes, tab.Indirect(start + 4 * i)), item) for i in range(count)]
        else:
            result[name] = _read(table.Table(tab.Bytes, tab.Indirect(o + tab.Pos)), kind)
    return result


def parse_metadata_buffer(buffer):
    """The "M001" flatbuffer bytes -> a JSON-able dict (field names as in the .fbs, enums by name)."""
    buffer = bytearray(buffer)
    if not flatbuffers.util.BufferHasIdentifier(buffer, 0, METADATA_IDENTIFIER):
        raise ValueError("not a TFLite metadata flatbuffer (identifier M001 missing).")
    root = flatbuffers.encode.Get(number_types.UOffsetTFlags.packer_type, buffer, 0)
    return _read(table.Table(buffer, root), "ModelMetadata")


def _find_metadata_buffer(model_bytes, name=METADATA_NAME):
    from ai_edge_litert import schema_py_generated as schema

    if not schema.Model.ModelBufferHasIdentifier(model_bytes, 0):
        raise ValueError("not a TFLite model (flatbuffer identifier TFL3 missing).")
    model = schema.Model.GetRootAs(model_bytes, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name().decode("utf-8") == name:
            buffer = model.Buffers(entry.Buffer())
            if buffer.Offset() > 1:  # stored outside the flatbuffer (large models)
                return bytes(model_bytes[buffer.Offset(): buffer.Offset() + buffer.Size()])
            return buffer.DataAsNumpy().tobytes() if buffer.DataLength() else b""
    return None


def read_flatbuffer(path):
    """The bytes of a .tflite file, with a clear error for a missing file or one that is no TFLite flatbuffer."""
    from ai_edge_litert import schema_py_generated as schema

    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"`tflite` file {str(path)!r} does not exist.") from None
    except IsADirectoryError:
        raise ValueError(f"`tflite` {str(path)!r} is a directory, not a .tflite file.") from None
    if len(data) < 8 or not schema.Model.ModelBufferHasIdentifier(data, 0):
        raise ValueError(f"`tflite` file {str(path)!r} is not a TFLite model (no TFL3 flatbuffer identifier; "
                         f"{len(data)} bytes starting {data[:8]!r}).")
    try:  # the schema's version 3 and a subgraph: what a truncated or overwritten file lacks
        model = schema.Model.GetRootAs(data, 0)
        readable = model.Version() == 3 and model.SubgraphsLength() > 0
    except Exception:  # the generated reader fails anywhere on a corrupt offset
        readable = False
    if not readable:
        raise ValueError(f"`tflite` file {str(path)!r} is not a readable TFLite model (a TFL3 identifier, but no "
                         "schema-3 model with a subgraph behind it).")
    return data


def read_min_runtime_version(model):
    """The model's "min_runtime_version" entry (a .tflite path or its bytes), or None where it has none."""
    data = model if isinstance(model, (bytes, bytearray)) else read_flatbuffer(model)
    value = _find_metadata_buffer(bytes(data), RUNTIME_VERSION_NAME)
    if value is None:
        return None
    return value.rstrip(b"\0").decode("ascii", "replace") or None


def read_model_metadata(model):
    """(metadata dict, {associated file name: bytes}) of a .tflite path or its bytes; ValueError if it has none."""
    data = model if isinstance(model, (bytes, bytearray)) else open(model, "rb").read()
    buffer = _find_metadata_buffer(bytes(data))
    if buffer is None:
        raise ValueError("the TFLite model carries no metadata (no TFLITE_METADATA buffer).")
    files = {}
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = {name: archive.read(name) for name in archive.namelist()}
    return parse_metadata_buffer(buffer), files


def read_labels(model):
    """The class names of a classifier exported by vit-keras (its TENSOR_AXIS_LABELS file), in score order."""
    metadata, files = read_model_metadata(model)
    for tensor in metadata["subgraph_metadata"][0].get("output_tensor_metadata", []):
        for file in tensor.get("associated_files", []):
            if file.get("type") == "TENSOR_AXIS_LABELS":
                if file["name"] not in files:
                    raise ValueError(f"the label file {file['name']!r} named in the metadata is not packed in the model.")
                return files[file["name"]].decode("utf-8").splitlines()
    raise ValueError("the TFLite metadata names no TENSOR_AXIS_LABELS file.")


def input_normalization(metadata):
    """(mean, std) lists of the first input tensor's NormalizationOptions, or None."""
    tensor = metadata["subgraph_metadata"][0]["input_tensor_metadata"][0]
    for unit in tensor.get("process_units", []):
        if unit.get("options_type") == "NormalizationOptions":
            return unit["options"]["mean"], unit["options"]["std"]
    return None
