"""How many images a training step holds at once: gradient accumulation sized to a memory budget.

Backpropagation keeps every block's activations until the backward pass reaches it. Per image, a transformer
block saves about 13 D + 2 M + 2 H T floats a token (the norms, q/k/v, the attention logits and probabilities,
the MLP's hidden layer before and after GELU, the residuals): for a ViT-Ti/16 at 224 px about 49 MB an image, so
a batch of 128 holds 6.3 GB before the first update, more than the data it streams. A batch whose activations
exceed ``ACTIVATION_BUDGET`` therefore runs as ``accumulation_steps`` smaller steps whose gradients the optimizer
averages before it updates (Keras's ``gradient_accumulation_steps``): the same update for the same images, with
the memory of one small step. docs/training.md#memory shows the measured figures.
"""

import math

from vit_keras.constants import ACTIVATION_BUDGET, FLOAT_BYTES
from vit_keras.models.layers import kept_patches


def token_count(vit):
    """The tokens the encoder trains on for a VisionTransformer config ``vit``: its patches (those PatchDropout
    keeps), plus the class token."""
    height, width = vit["image_size"]
    patch = vit["patch_size"]
    rows, cols = (patch, patch) if isinstance(patch, int) else patch
    patches = kept_patches((height // rows) * (width // cols), vit.get("patch_dropout") or 0.0)
    return patches + int(bool(vit.get("class_token", True)))


def activation_bytes(vit):
    """Estimated bytes of activations one image keeps for its backward pass through the encoder of ``vit``."""
    tokens, width, hidden, heads = token_count(vit), vit["hidden_size"], vit["mlp_dim"], vit["num_heads"]
    per_token = 13 * width + 2 * hidden + 2 * heads * tokens
    return vit["num_layers"] * tokens * per_token * FLOAT_BYTES


def accumulation_steps(vit, batch_size, parallel=1, budget=ACTIVATION_BUDGET):
    """The fewest steps a batch of ``batch_size`` images of model ``vit`` splits into so that one step's
    activations (``activation_bytes``) stay within ``budget``. Each step's share must divide evenly over
    ``parallel`` (devices, or concurrent micro-batches); 1 where the batch already fits."""
    per_image = activation_bytes(vit)
    for steps in range(1, batch_size + 1):
        share = batch_size / steps
        if share != int(share) or share % parallel:
            continue
        if share * per_image <= budget:
            return steps
    return max((steps for steps in range(1, batch_size + 1)
                if batch_size % steps == 0 and (batch_size // steps) % parallel == 0), default=1)


def describe(vit, batch_size, steps, budget=ACTIVATION_BUDGET):
    """One line for the run's log: the step a batch runs as, and why."""
    size = "x".join(str(side) for side in vit["image_size"])
    whole = batch_size * activation_bytes(vit) / 1e9
    if steps == 1:
        return (f"memory: a batch of {batch_size} at {size} holds about {whole:.2f} GB of activations, within the "
                f"{budget / 1e9:.2f} GB a step may hold: one step a batch")
    return (f"memory: a batch of {batch_size} at {size} would hold about {whole:.1f} GB of activations; it runs as "
            f"{steps} accumulated steps of {batch_size // steps} images (the same update, "
            f"{math.ceil(batch_size // steps * activation_bytes(vit) / 1e6)} MB a step); --accumulate sets it")
