"""Print timm's parameter counts (1000 classes) for every vit-keras model name.

Reference-only: needs `pip install torch==2.14.1 torchvision==0.29.1 timm`; never run in CI.
The printed table is committed in tests/test_models.py.
"""

import timm

TIMM_NAMES = {
    "vit_ti16": "vit_tiny_patch16_224",
    "vit_s16": "vit_small_patch16_224",
    "vit_s32": "vit_small_patch32_224",
    "vit_b8": "vit_base_patch8_224",
    "vit_b16": "vit_base_patch16_224",
    "vit_b32": "vit_base_patch32_224",
    "vit_l16": "vit_large_patch16_224",
    "vit_l32": "vit_large_patch32_224",
    "vit_h14": "vit_huge_patch14_224",
    "vit_r26_s32": "vit_small_r26_s32_224",
    "vit_r50_b16": "vit_base_r50_s16_224",
    "vit_r50_l32": "vit_large_r50_s32_224",
}

if __name__ == "__main__":
    for ours, theirs in TIMM_NAMES.items():
        model = timm.create_model(theirs, pretrained=False, num_classes=1000)
        print(f'    "{ours}": {sum(p.numel() for p in model.parameters())},  # timm {theirs}')
