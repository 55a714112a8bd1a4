"""Runs a .tflite file under an older TFLite runtime, in that runtime's own environment (tests/test_runtimes.py).

    .venv-compat/tflite-runtime-2.14.0/bin/python tests/old_runtime_worker.py tflite_runtime.interpreter \
        model.tflite inputs.npy scores.npy

inputs.npy holds the model's inputs, prepared (dtype and normalization) by the caller, one image a row. The scores
go to scores.npy; where the runtime refuses the file, its error goes to stderr and the exit status is 3. NumPy and
the runtime's interpreter module only: that environment has nothing else.
"""

import importlib
import sys

import numpy as np

REFUSED = 3


def main(module, model, inputs, out):
    interpreter_module = importlib.import_module(module)
    try:
        interpreter = interpreter_module.Interpreter(model_path=model)
        interpreter.allocate_tensors()
    except Exception as error:  # the runtime's own words: which op and version it lacks
        print(f"refused: {type(error).__name__}: {error}", file=sys.stderr)
        return REFUSED
    first_input, first_output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    scores = []
    for row in np.load(inputs):
        interpreter.set_tensor(first_input["index"], row[None])
        interpreter.invoke()
        scores.append(np.array(interpreter.get_tensor(first_output["index"])[0]))
    np.save(out, np.stack(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
