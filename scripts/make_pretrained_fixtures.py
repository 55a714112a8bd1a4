"""Make tests/fixtures/pretrained/: tiny checkpoint folders as their owners save them, and the owners' logits.

Run with the reference environment (torch, timm, transformers), not in CI:

    /work/.venv-ref/bin/python scripts/make_pretrained_fixtures.py

Each case is a seeded random model of one ViT variant, saved by its own library (transformers'
``save_pretrained`` with its image processor, timm's ``save_for_hf`` with label names), then run by that library
on fixed 0-255 images normalized as the folder says. ``expected.npz`` holds the images' seed and the logits;
tests/test_pretrained.py loads each folder with ``vit_keras.from_pretrained(folder)`` alone and compares.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "pretrained")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from pretrained_cases import CASES, pixels  # noqa: E402

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TIMM_SMALL = dict(embed_dim=32, depth=2, num_heads=2)
LABELS = ["cat", "dog", "fox", "owl"]


def perturb(model, seed):
    """Every parameter moved off its initial value (LayerScale's constant, zero tokens and biases)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model.eval()


@torch.no_grad()
def logits(model, images, mean, std, hf):
    x = (torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean)[:, None, None]) \
        / torch.tensor(std)[:, None, None]
    out = model(pixel_values=x).logits if hf else model(x)
    return out.numpy()


def hugging_face(case, folder):
    import transformers as t

    spec = CASES[case]
    kind = spec["kind"]
    labels = dict(num_labels=4, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    if kind == "vit":
        config = t.ViTConfig(**SMALL, image_size=32, patch_size=8, layer_norm_eps=1e-12, **labels)
        model = t.ViTForImageClassification(config)
    elif kind in ("deit", "deit_teacher"):
        config = t.DeiTConfig(**SMALL, image_size=32, patch_size=8, **labels)
        model = (t.DeiTForImageClassificationWithTeacher if kind == "deit_teacher" else t.DeiTForImageClassification)(
            config)
    else:
        common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=4, image_size=40,
                      patch_size=4, layerscale_value=0.5, **labels)
        if kind == "dinov2":
            model = t.Dinov2ForImageClassification(t.Dinov2Config(**common))
        else:
            model = t.Dinov2WithRegistersForImageClassification(t.Dinov2WithRegistersConfig(
                **common, num_register_tokens=4))
    perturb(model, spec["seed"])
    model.save_pretrained(folder)
    size = spec["image_size"]
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if kind.startswith("dinov2"):  # DINOv2's processor: resize the short side, then center-crop
        processor = t.BitImageProcessor(size={"shortest_edge": size + 4}, crop_size={"height": size, "width": size},
                                        do_center_crop=True, image_mean=mean, image_std=std, resample=3)
    else:
        processor = t.ViTImageProcessor(size={"height": size, "width": size}, image_mean=mean, image_std=std)
    processor.save_pretrained(folder)
    return model, mean, std, True


def timm_case(case, folder):
    import timm
    from timm.models import _hub

    spec = CASES[case]
    model = timm.create_model(spec["architecture"], pretrained=False, num_classes=4, **TIMM_SMALL,
                              **spec["timm_args"])
    perturb(model, spec["seed"])
    mean, std = list(model.pretrained_cfg["mean"]), list(model.pretrained_cfg["std"])
    _hub.save_for_hf(model, folder, model_config={"label_names": LABELS}, safe_serialization=True)
    for leftover in ("pytorch_model.bin",):
        if os.path.exists(os.path.join(folder, leftover)):
            os.remove(os.path.join(folder, leftover))
    return model, mean, std, False


def main():
    os.makedirs(OUT, exist_ok=True)
    for case, spec in CASES.items():
        folder = os.path.join(OUT, case)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        torch.manual_seed(spec["seed"])
        make = hugging_face if spec["library"] == "transformers" else timm_case
        model, mean, std, hf = make(case, folder)
        images = pixels(spec["image_size"], spec["seed"])
        expected = logits(model, images, mean, std, hf)
        np.savez(os.path.join(folder, "expected.npz"), logits=expected.astype(np.float32))
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"{case}: {sorted(os.listdir(folder))}, {size / 1e3:.0f} kB, logits {expected.shape}")
        with open(os.path.join(folder, "config.json")) as f:
            json.load(f)


if __name__ == "__main__":
    main()
