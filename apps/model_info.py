"""What the app needs from a .tflite's metadata, read with convert.metadata's TensorFlow-free reader."""

from dataclasses import dataclass, field

from vit_keras.convert.metadata import read_model_metadata


@dataclass
class ModelInfo:
    name: str = ""
    description: str = ""
    version: str = ""
    author: str = ""
    license: str = ""
    labels: list = field(default_factory=list)
    mean: list | None = None
    std: list | None = None
    color_space: str | None = None
    image_size: tuple | None = None  # (height, width)
    output_names: list = field(default_factory=list)
    has_metadata: bool = False


def _label_lines(files, tensors):
    for tensor in tensors:
        for file in tensor.get("associated_files", []):
            if file.get("type") == "TENSOR_AXIS_LABELS" and file.get("name") in files:
                text = files[file["name"]].decode("utf-8", "replace")
                return [line.strip() for line in text.splitlines() if line.strip()]
    return []


def read_model_info(data):
    """ModelInfo from the bytes of a .tflite; fields stay empty where the file carries no metadata.

    Raises ValueError when the bytes are not a TFLite flatbuffer at all.
    """
    if len(data) < 8 or bytes(data[4:8]) != b"TFL3":
        raise ValueError("not a TFLite model (no 'TFL3' flatbuffer identifier)")
    try:
        metadata, files = read_model_metadata(bytes(data))
    except ValueError as error:
        if "no metadata" in str(error):
            return ModelInfo()
        raise
    info = ModelInfo(has_metadata=True)
    for key in ("name", "description", "version", "author", "license"):
        setattr(info, key, metadata.get(key, ""))
    subgraph = (metadata.get("subgraph_metadata") or [{}])[0]
    inputs, outputs = subgraph.get("input_tensor_metadata", []), subgraph.get("output_tensor_metadata", [])
    info.output_names = [tensor.get("name", "") for tensor in outputs]
    info.labels = _label_lines(files, outputs + [metadata])
    if inputs:
        content = inputs[0].get("content", {})
        if content.get("content_properties_type") == "ImageProperties":
            image = content.get("content_properties", {})
            info.color_space = image.get("color_space")
            size = image.get("default_size", {})
            if size.get("width") and size.get("height"):
                info.image_size = (size["height"], size["width"])
        for unit in inputs[0].get("process_units", []):
            if unit.get("options_type") == "NormalizationOptions":
                info.mean, info.std = unit["options"].get("mean"), unit["options"].get("std")
    return info
