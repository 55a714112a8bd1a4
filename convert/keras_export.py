"""``model.export(path, format="litert")`` of a VisionTransformer that Keras's ``model.quantize`` changed.

Keras's int8 Dense multiplies int8 activations, quantized per token as it runs, by int8 weights: an int8 matmul
that the TFLite converter cannot legalize ("'tfl.fully_connected' op operand #0 must be tensor of 32-bit float or
QI8 type"); its float8 Dense casts to float8, a type TFLite lacks. TFLite's own form of int8 is the dynamic-range
FULLY_CONNECTED, which quantizes activations per row as it runs and multiplies them by int8 weights kept per output
channel: the computation Keras's int8 layers do. So such a model is exported as its float twin (the int8 weights
dequantized, exactly: w = q / scale) converted with the converter's dynamic-range optimization, which quantizes
those weights back to the same int8 values. A float8 model's weights are float32 already: its twin is exported in
float32. int4 layers trace to builtin ops and export as Keras makes them.
"""

import keras

from vit_keras import framework

# The quantization modes whose layers export through the float twin, and what the converter makes of it.
TWIN_MODES = ("int8", "float8")


def quantization_modes(model):
    """The quantization modes of ``model``'s layers (empty for a float model)."""
    return {layer.quantization_mode for layer in framework.flatten_layers(model, include_self=True) if layer.quantization_mode}


def float_twin(model):
    """A float VisionTransformer with ``model``'s config and weights; int8 kernels dequantized (q / scale)."""
    from vit_keras.models.vision_transformer import QUANTIZED_LAYERS, VisionTransformer, sublayers

    config = {key: value for key, value in model.get_config().items() if key != QUANTIZED_LAYERS}
    twin = VisionTransformer.from_config(config)
    targets = dict(sublayers(twin))
    for path, source in sublayers(model):
        if not source.quantization_mode:
            continue
        layer = targets[path]  # a Dense, named by vit_keras: the same path in every instance
        own = {v.path.removeprefix(layer.path + "/"): v for v in layer.weights}
        if source.quantization_mode == "int8":
            kernel = keras.ops.convert_to_numpy(source.kernel).astype("float32")
            own["kernel"].assign(kernel / keras.ops.convert_to_numpy(source.kernel_scale))
            if source.bias is not None:
                own["bias"].assign(source.bias)
        elif source.quantization_mode == "float8":
            own["kernel"].assign(source.kernel)
            if source.bias is not None:
                own["bias"].assign(source.bias)
    _copy_float_weights(model, twin, {path for path, layer in sublayers(model) if layer.quantization_mode})
    return twin


def _copy_float_weights(model, twin, quantized):
    """Every weight of the layers no quantization touched, matched by path (quantized layers' own are set)."""
    values = {v.path: v for v in model.weights}
    for variable in twin.weights:
        if variable.path.rsplit("/", 1)[0] in quantized:
            continue
        source = values.get(variable.path)
        if source is None or tuple(source.shape) != tuple(variable.shape):
            raise ValueError(f"the quantized model has no float weight {variable.path!r} {tuple(variable.shape)} "
                             "to export; quantize a VisionTransformer made by vit_keras, then export it.")
        variable.assign(source)


def export_litert(model, filepath, verbose=None, input_signature=None, **kwargs):
    """Keras's LiteRT export of ``model``'s float twin; int8 adds the converter's dynamic-range optimization unless
    ``kwargs`` set ``optimizations`` (passed to the converter, as Keras's own export does)."""
    import tensorflow as tf

    modes = quantization_modes(model)
    if modes - set(TWIN_MODES):
        raise ValueError(f"`model` mixes quantization modes {sorted(modes)}; export a model quantized in one of "
                         f"{', '.join(TWIN_MODES)} alone, or in int4 alone.")
    if "int8" in modes:
        kwargs.setdefault("optimizations", [tf.lite.Optimize.DEFAULT])
    return float_twin(model).export(filepath, format="litert", verbose=verbose, input_signature=input_signature,
                                    **kwargs)


def needs_twin(model):
    """Whether ``model.export(format="litert")`` goes through the float twin (int8 or float8 layers)."""
    return bool(quantization_modes(model) & set(TWIN_MODES))
