"""Reading an exported file's second output, the attention rollout, with LiteRT (shared by the tests)."""

import numpy as np


def device_attention(path, images, classes=10):
    """The attention output of an exported file for 0-255 images (N, H, W, C), run by LiteRT: (N, gh, gw)."""
    from ai_edge_litert.interpreter import Interpreter

    from vit_keras.convert.runtime import model_input, prepare

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    dtype, _, norm = model_input(path)
    scores, attention = interpreter.get_output_details()  # the scores first, as classifiers read them
    assert list(scores["shape"]) == [1, classes]
    maps = []
    for image in prepare(images, dtype, norm):
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image[None])
        interpreter.invoke()
        maps.append(interpreter.get_tensor(attention["index"])[0])
    return np.stack(maps)
