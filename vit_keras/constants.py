"""The choice lists and constants that the library, the converter and the command line share.

Standard library only: the CLI imports this to build its parser, and the device runtime may import it, without
loading Keras or TensorFlow.
"""

# Training
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")
RECIPES = ("quick", "long")  # the hyper-parameter tables are in vit_keras.train_config
AUGMENTATIONS = ("none", "flip", "crop", "randaugment")
SPLITS = ("train", "val", "test")

# Model options
POSITION_EMBEDDINGS = ("learned", "learned_2d", "sincos_2d", "none")
POOLINGS = ("token", "gap")

# Export and the device runtimes
QUANTIZATIONS = ("float32", "float16", "dynamic", "int8")
RUNTIMES = ("interpreter", "compiled")  # LiteRT's Interpreter and CompiledModel APIs

# The Google checkpoints' input range: (pixel - 127.5) / 127.5 in [-1, 1].
PIXEL_MEAN = 127.5
PIXEL_STD = 127.5

# ITU-R BT.601 luma weights, as tf.image.rgb_to_grayscale uses them (RGB -> gray).
LUMA_WEIGHTS = (0.2989, 0.5870, 0.1140)
