"""The reference side of ``benchmarks/pretrained_parity.py``: run in the benchmark-only venv (torch, timm,
transformers), never in CI.

    /work/.venv-ref/bin/python benchmarks/pretrained_reference.py REAL_DIR OUT_DIR

From the real ViT-Ti/16 (``shared/fixtures/real_imagenet.py``'s REAL_DIR) it writes two folders as their owners
save them: ``timm_vit_tiny`` (timm's ``save_for_hf``, with the 1,000 label names) and ``hf_vit_tiny_200``
(transformers' ``save_pretrained`` of a ViTForImageClassification with the first 200 classes' head, layer-norm
epsilon 1e-12 and id2label: the issue's fine-tuned folder). It resizes the 1,000 photos to 224 px (bicubic, PIL)
into ``photos.npy`` and stores each library's logits for them in ``reference.npz``; and for each random variant
folder of tests/fixtures/pretrained (DeiT, DINOv2, registers, ...), its library's logits for the photos resized
again to that folder's input size.
"""

import os
import sys

import numpy as np
import torch


def photos(real):
    from PIL import Image

    root = os.path.join(real, "photos")
    paths = [os.path.join(root, c, f) for c in sorted(os.listdir(root))
             for f in sorted(os.listdir(os.path.join(root, c)))]
    return np.stack([np.asarray(Image.open(p).convert("RGB").resize((224, 224), Image.BICUBIC)) for p in paths])


def timm_to_hugging_face(state, depth):
    """timm's vit_tiny_patch16_224 names -> transformers' ViTForImageClassification names."""
    out = {"vit.embeddings.cls_token": state["cls_token"], "vit.embeddings.position_embeddings": state["pos_embed"],
           "vit.embeddings.patch_embeddings.projection.weight": state["patch_embed.proj.weight"],
           "vit.embeddings.patch_embeddings.projection.bias": state["patch_embed.proj.bias"],
           "vit.layernorm.weight": state["norm.weight"], "vit.layernorm.bias": state["norm.bias"],
           "classifier.weight": state["head.weight"], "classifier.bias": state["head.bias"]}
    for i in range(depth):  # transformers 5's in-memory names (its files keep the hub's older ones)
        t, h = f"blocks.{i}.", f"vit.layers.{i}."
        for kind in ("weight", "bias"):
            for name, value in zip(("q_proj", "k_proj", "v_proj"), state[t + f"attn.qkv.{kind}"].chunk(3)):
                out[h + f"attention.{name}.{kind}"] = value
        pairs = (("attn.proj", "attention.o_proj"), ("norm1", "layernorm_before"), ("norm2", "layernorm_after"),
                 ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"))
        for ours, theirs in pairs:
            for kind in ("weight", "bias"):
                out[h + f"{theirs}.{kind}"] = state[t + f"{ours}.{kind}"]
    return out


@torch.no_grad()
def logits(model, images, hf, mean=(0.5,) * 3, std=(0.5,) * 3):
    out = []
    mean, std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    for start in range(0, len(images), 50):
        x = (torch.from_numpy(images[start:start + 50]).permute(0, 3, 1, 2).float() / 255 - mean) / std
        out.append((model(pixel_values=x).logits if hf else model(x)).numpy())
    return np.concatenate(out)


def resized(images, size):
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC)) for image in images])


def fixture_logits(folder, images):
    """The logits of a tests/fixtures/pretrained folder's own library for ``images`` at its input size."""
    import json

    import timm
    import transformers as t

    config = json.load(open(os.path.join(folder, "config.json")))
    if "model_type" in config:
        processor = json.load(open(os.path.join(folder, "preprocessor_config.json")))
        model = t.AutoModelForImageClassification.from_pretrained(folder).eval()
        size = processor["crop_size"]["height"] if processor.get("do_center_crop") else processor["size"]["height"]
        return logits(model, resized(images, size), True, processor["image_mean"], processor["image_std"])
    from safetensors.torch import load_file

    cfg = config["pretrained_cfg"]
    model = timm.create_model(config["architecture"], pretrained=False, num_classes=config["num_classes"],
                              **{k: v for k, v in config.get("model_args", {}).items() if k != "num_classes"})
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))  # strict: every tensor used
    model.eval()
    return logits(model, resized(images, cfg["input_size"][-1]), False, cfg["mean"], cfg["std"])


def main():
    import timm
    import transformers as t
    from safetensors.torch import load_file
    from timm.models import _hub

    real, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    labels = open(os.path.join(real, "labels.txt")).read().splitlines()
    state = load_file(os.path.join(real, "vit_ti16_in1k.safetensors"))
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    model.load_state_dict(state)
    model.eval()
    _hub.save_for_hf(model, os.path.join(out, "timm_vit_tiny"), model_config={"label_names": labels},
                     safe_serialization=True)
    config = t.ViTConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768,
                         layer_norm_eps=1e-12, num_labels=200, id2label=dict(enumerate(labels[:200])),
                         label2id={n: i for i, n in enumerate(labels[:200])})
    hf = t.ViTForImageClassification(config)
    converted = timm_to_hugging_face(state, 12)
    converted["classifier.weight"], converted["classifier.bias"] = (converted[k][:200] for k in (
        "classifier.weight", "classifier.bias"))
    hf.load_state_dict(converted)
    hf.eval()
    hf.save_pretrained(os.path.join(out, "hf_vit_tiny_200"))
    t.ViTImageProcessor(size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                        resample=3).save_pretrained(os.path.join(out, "hf_vit_tiny_200"))
    images = photos(real)
    np.save(os.path.join(out, "photos.npy"), images)
    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures",
                            "pretrained")
    variants = {f"fixture_{case}": fixture_logits(os.path.join(fixtures, case), images)
                for case in sorted(os.listdir(fixtures))}
    np.savez(os.path.join(out, "reference.npz"), timm_vit_tiny=logits(model, images, False),
             hf_vit_tiny_200=logits(hf, images, True), **variants)
    print(f"wrote {out}: 2 folders, {len(images)} photos, {t.__version__=} {timm.__version__=}")


if __name__ == "__main__":
    main()
