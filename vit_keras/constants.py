"""The choice lists and constants that the library, the converter and the command line share.

Standard library only: the CLI imports this to build its parser, and the device runtime may import it, without
loading Keras or TensorFlow.
"""

# Training
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
INFERENCE_PRECISIONS = ("float32", "bfloat16", "int8")  # vit_keras.inference.precision
# The Keras backends vit-keras trains on, and the distribution strategies each has (vit_keras.training.strategies).
BACKENDS = ("tensorflow", "jax", "torch")
BACKEND_STRATEGIES = {
    "tensorflow": ("auto", "default", "mirrored", "multi_worker", "tpu"),  # tf.distribute
    "jax": ("auto", "default", "data_parallel"),  # keras.distribution.DataParallel
    "torch": ("auto", "default"),  # one device: Keras's torch trainer has no distribution
}
STRATEGIES = tuple(dict.fromkeys(name for names in BACKEND_STRATEGIES.values() for name in names))  # all of them
BASE_BATCH_SIZE = 512  # the linear scaling rule: a recipe's peak LR = base_lr * batch size / 512

# Both recipes train one design: a hybrid ViT whose conv stem (3x3 stride-2 convs, Xiao et al. 2021) feeds a
# 4x4 grid of tokens (28x28 images at 32, patch 8) to 4 blocks of width 96, GAP pooling (no class token), tanh
# GELU. Quick: 20 epochs. Long: 90 epochs with random erasing, which keeps the longer schedule from overfitting.
# The values won trials on Fashion-MNIST: docs/benchmarks.md#why-the-recipes-values, docs/benchmarks.md#the-token-count and
# docs/benchmarks.md#random-erasing.
# Small data: the schedule has a floor of `min_steps` optimizer steps (20 epochs over 1,000 images would be 140),
# the many passes over each image that it makes use random-resized crops, not flips alone, and random erasing
# (`small_data_erase`, in full from `erase_passes` passes over the images, less below), and the ViT learns from
# a small CNN's labels too, the CNN trained first for `teacher_steps` (vit_keras.training.distill;
# docs/benchmarks.md#small-data-against-a-cnn).
RECIPE_MODEL = dict(hidden_size=96, num_heads=3, mlp_dim=192, num_layers=4, pooling="gap", class_token=False,
             gelu_approximate=True, stem="conv")
RECIPE_TABLES = {
    "quick": dict(model=RECIPE_MODEL, grid=(4, 4), epochs=20, min_steps=3000, batch_size=128, base_lr=1.6e-2,
                  optimizer="adamw", weight_decay=0.05, warmup_epochs=0.5, label_smoothing=0.1, drop_path=0.0,
                  patch_dropout=0.0, augment="flip", small_data_augment="crop", single_pass_augment="flip",
                  crop_scale=(0.35, 1.0), mixup=0.0, cutmix=0.0, erase=0.0, small_data_erase=0.25, erase_passes=200,
                  teacher_steps=800),
    "long": dict(model=RECIPE_MODEL, grid=(4, 4), epochs=90, min_steps=8000, batch_size=128, base_lr=1.6e-2,
                 optimizer="adamw", weight_decay=0.05, warmup_epochs=0.5, label_smoothing=0.1, drop_path=0.0,
                 patch_dropout=0.0, augment="flip", small_data_augment="crop", single_pass_augment="flip",
                 crop_scale=(0.64, 1.0), mixup=0.0, cutmix=0.0, erase=0.5, small_data_erase=0.5, erase_passes=200,
                 teacher_steps=2000),
    # Pretrained weights (a preset, a checkpoint, a .keras model): the model is theirs. The paper's fine-tuning
    # (Appendix B.1.1: SGD with momentum 0.9, no weight decay, clipping at global norm 1, cosine decay after a
    # warm-up; the zero head is the loader's), at peak LR 0.02 for batch 64, on random-resized crops and flips; 3
    # epochs with a floor of 300 steps. SGD beat AdamW at its best LR, and crops beat flips alone, in the trials of
    # docs/benchmarks.md, "Fine-tuning a pretrained ViT"; a run that sees each image once (the CPU's budget may
    # buy one epoch at a larger size: vit_keras.training.finetune) takes flips alone, which beat crops there
    # (docs/benchmarks.md#one-pass-at-a-larger-size). Every patch token trains (patch_dropout 0): dropping half
    # bought a larger size in the same minutes but lost accuracy on CIFAR-10 (docs/benchmarks.md#patch-dropout).
    "finetune": dict(model=None, grid=None, epochs=3, min_steps=300, batch_size=64, base_lr=0.16,
                     optimizer="sgd", weight_decay=0.0, warmup_epochs=0.5, label_smoothing=0.0, drop_path=0.0,
                     patch_dropout=0.0, augment="crop", small_data_augment="crop", single_pass_augment="flip",
                     crop_scale=(0.35, 1.0), mixup=0.0, cutmix=0.0, erase=0.0, small_data_erase=0.0, erase_passes=200,
                     teacher_steps=800),
}
RECIPES = tuple(RECIPE_TABLES)
OPTIMIZERS = ("adamw", "sgd")  # AdamW (decoupled weight decay) and SGD with momentum 0.9
AUGMENTATIONS = ("none", "flip", "crop", "randaugment")
# A CNN teacher's labels (vit_keras.training.distill): "auto" distills where the recipe's ViT trains on small data.
DISTILLATIONS = ("auto", "cnn", "none")
SPLITS = ("train", "val", "test")
CHANNEL_COUNTS = (1, 3)  # the models' input channels: gray or RGB
# Where training reads its images from (vit_keras.data.sources): "auto" keeps a dataset in memory when its decoded
# images fit MEMORY_BUDGET_FRACTION of the machine's memory, else streams it from disk.
INPUT_MODES = ("auto", "memory", "stream")
MEMORY_BUDGET_FRACTION = 0.25
# Shards written by `vit-keras prepare` (vit_keras.data.shards): their format version and image encodings.
SHARD_VERSION = 1
SHARD_ENCODINGS = ("png", "jpeg")
IMAGES_PER_SHARD = 1024  # a shard file's records, by default

# Model options
POSITION_EMBEDDINGS = ("learned", "learned_2d", "sincos_2d", "none")
POOLINGS = ("token", "gap", "sequence", "token_gap")  # eq. 4's readout: vit_keras.models.readout

BENCH_MODELS = ("vit_ti16", "vit_s16", "vit_b16")  # `vit-keras bench` times these by default

# Export and the device runtimes
QUANTIZATIONS = ("float32", "float16", "dynamic", "int8")
INT8_RANGES = ("mse", "minmax")  # how static int8 picks each activation's range: vit_keras.convert.ranges
# int8's activations: rounded a token at a time when each layer runs (vit_keras.convert.dynamic_int8), or with
# one scale a tensor fixed at calibration (full integer, for integer-only accelerators); "auto" picks (convert.int8).
INT8_ACTIVATIONS = ("auto", "dynamic", "static")
# Where an exported file runs: "cpu" (and GPU): the quantization each mode gives; "npu": full integer, every op
# from input to output in int8 weights and int16 activations, as phone NPUs run them (--quantize int8 only).
EXPORT_TARGETS = ("cpu", "npu")
# What `train --export` and ship_run write, one file each: a quantization, or "npu" (int8 for the npu target).
NPU_MODE = "npu"
SHIP_MODES = QUANTIZATIONS + (NPU_MODE,)
RUNTIMES = ("interpreter", "compiled")  # LiteRT's Interpreter and CompiledModel APIs
# The older runtimes an exported file is checked under (convert/runtime_version.py): pip package, release, the
# TFLite version whose kernels it carries, its interpreter module. ai-edge-litert 1.0.1 (August 2024) came between
# TensorFlow 2.17 and 2.18. scripts/setup.sh makes one environment each, COMPAT_DIR/<package>-<release>, with
# NumPy < 2 (what they were built against).
COMPAT_RUNTIMES = (("tflite-runtime", "2.14.0", "2.14.0", "tflite_runtime.interpreter"),
                   ("ai-edge-litert", "1.0.1", "2.17.0", "ai_edge_litert.interpreter"))
COMPAT_DIR = ".venv-compat"

# The Google checkpoints' input range: (pixel - 127.5) / 127.5 in [-1, 1].
PIXEL_MEAN = 127.5
PIXEL_STD = 127.5

# Named input normalizations (create_model's pixel_mean/pixel_std), per RGB channel in [0, 1] units as timm gives
# them: the Google checkpoints' (PIXEL_MEAN / 255) and timm's IMAGENET_DEFAULT_MEAN / IMAGENET_DEFAULT_STD.
NORMALIZATIONS = {
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}

# ITU-R BT.601 luma weights, as tf.image.rgb_to_grayscale uses them (RGB -> gray).
LUMA_WEIGHTS = (0.2989, 0.5870, 0.1140)

# TrainConfig's bounds on its float settings, which the CLI checks too: (setting, test, the valid range in words).
BOUNDS = (("warmup_epochs", lambda v: v >= 0, ">= 0"), ("weight_decay", lambda v: v >= 0, ">= 0"),
          ("label_smoothing", lambda v: 0 <= v < 1, "in [0, 1)"), ("drop_path", lambda v: 0 <= v < 1, "in [0, 1)"),
          ("patch_dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
          ("mixup", lambda v: v >= 0, ">= 0"), ("cutmix", lambda v: v >= 0, ">= 0"),
          ("erase", lambda v: 0 <= v <= 1, "in [0, 1]"),
          ("learning_rate", lambda v: v > 0, "> 0"), ("val_fraction", lambda v: 0 < v < 1, "in (0, 1)"))

# Defaults the library and the CLI's help share.
STEPS_PER_EXECUTION = 8  # TrainConfig.steps_per_execution
MICRO_BATCHES = 2  # TrainConfig.micro_batches: concurrent XLA programs a step on one device
# The activations one training step may hold (vit_keras.training.memory): a larger batch accumulates its gradients
# over several steps. 1 GB: 16 images a step for a ViT-Ti/16 at 224 px; a step of 64 at 128 px trained 10-25% faster
# than 4 of 16 on 2 cores, while at 224 px steps of 4 to 32 images ran alike (docs/training.md#training-at-224-px-memory).
ACTIVATION_BUDGET = 1_000_000_000
FLOAT_BYTES = 4  # float32 activations (mixed precision halves most: the estimate stays on the safe side)
BACKUP_MINUTES = 10.0  # TrainConfig.backup_every's default: minutes of training between backups
PROGRESS_SECONDS = 45.0  # a log (stdout not a terminal) gets a progress line this often within an epoch
VAL_FRACTION = 0.1  # a folder's held-out share
MIN_CALIBRATION_IMAGES = 100  # int8: fewer leave the activation ranges to chance
DEFAULT_CALIBRATION_IMAGES = 300
# Pretrained weights
GCS_HTTPS = "https://storage.googleapis.com/"  # gs://bucket/x is public at GCS_HTTPS + "bucket/x"
IMAGENET_CLASSES_FILE = "imagenet2012.txt"  # the 1,000 ImageNet-1k class names, shipped in vit_keras.weights
