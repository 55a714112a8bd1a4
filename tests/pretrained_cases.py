"""The cases of tests/fixtures/pretrained/ (written by scripts/make_pretrained_fixtures.py), numpy only.

Each is a tiny random checkpoint of one ViT variant, saved by the library its users get it from; the images are
regenerated from their seed, and ``expected.npz`` holds that library's logits for them.
"""

import numpy as np

FIXTURES = "tests/fixtures/pretrained"
CASES = {
    # Hugging Face transformers: save_pretrained + the image processor
    "hf_vit": dict(library="transformers", kind="vit", image_size=32, seed=1),  # 4 named labels, eps 1e-12
    "hf_deit_distilled": dict(library="transformers", kind="deit_teacher", image_size=32, seed=2),
    "hf_deit": dict(library="transformers", kind="deit", image_size=32, seed=3),  # the class token's head alone
    "hf_dinov2": dict(library="transformers", kind="dinov2", image_size=32, seed=4),  # LayerScale, [cls; mean]
    "hf_dinov2_registers": dict(library="transformers", kind="dinov2_registers", image_size=32, seed=5),
    # timm: save_for_hf with label names
    "timm_deit3": dict(library="timm", architecture="deit3_small_patch16_224", image_size=32, seed=6,
                       timm_args=dict(img_size=32, patch_size=8)),  # LayerScale, no_embed_class
    "timm_dinov2_registers": dict(library="timm", architecture="vit_small_patch14_reg4_dinov2", image_size=56,
                                  seed=7, timm_args=dict(img_size=56)),  # patch 14, 4 registers, LayerScale
    "timm_deit_distilled": dict(library="timm", architecture="deit_tiny_distilled_patch16_224", image_size=32,
                                seed=8, timm_args=dict(img_size=32, patch_size=8)),
    "timm_vit_mean_pool": dict(library="timm", architecture="vit_base_patch16_224", image_size=32, seed=9,
                               timm_args=dict(img_size=32, patch_size=8, class_token=False, global_pool="avg",
                                              fc_norm=False)),
}


def pixels(size, seed, count=3):
    """Fixed 0-255 RGB images (count, size, size, 3), float32 of whole numbers."""
    return np.random.RandomState(seed).randint(0, 256, (count, size, size, 3)).astype(np.float32)
