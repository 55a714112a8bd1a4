"""Named pretrained checkpoints: every public ViT release the loaders read, by timm's name.

    vit_keras.list_presets()                                             # the names
    vit_keras.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k")  # downloaded once, cached, loaded
    vit_keras.create_model("vit_base_patch16_224_imagenet", num_classes=10, image_size=96)  # keras-hub's name

``PRESETS`` is data only: one ``Preset`` a checkpoint, with the facts of its release (URL, image size,
normalization, classes, labels, licence, where the facts come from). Names follow timm's
``<architecture>_<size>.<pretraining tag>``; keras-hub's names for the same releases are aliases.
No checksum is recorded for any of them: none is published with the files, so a download is checked
for its announced length only (``Preset.sha256`` is None; the listing says so).
"""

import dataclasses
import difflib
import os
from importlib import resources

from vit_keras.constants import GCS_HTTPS, IMAGENET_CLASSES_FILE

GCS = GCS_HTTPS + "vit_models/"
ORIGINAL = "google-research/vision_transformer README: gs://vit_models/"
AUGREG = ("google-research/vision_transformer README (gs://vit_models/augreg); timm vision_transformer.py "
          "default_cfgs")
AUGREG_HYBRID = "google-research/vision_transformer (gs://vit_models/augreg); timm vision_transformer_hybrid.py"
APACHE = "Apache-2.0"
IMAGENET_1K = IMAGENET_CLASSES_FILE
IN21K, IN21K_1K, IN1K = "ImageNet-21k", "ImageNet-21k, fine-tuned on ImageNet-1k", "ImageNet-1k"
ZERO_HEAD = "the 21k head is zero in the release (timm: 'classifier not valid'): for features and fine-tuning"
NO_21K_LABELS = "no ImageNet-21k label list ships with vit_keras"


@dataclasses.dataclass(frozen=True)
class Preset:
    """One public checkpoint. model: the ``vit_keras.MODELS`` name it loads into; image_size: the resolution it
    was trained at; normalization: a ``vit_keras.constants.NORMALIZATIONS`` name; labels: a class-name file that
    ships in vit_keras, or None; representation_size: its pre_logits width (the original ImageNet-21k files)."""

    name: str
    model: str
    url: str
    image_size: int
    num_classes: int
    pretraining: str
    source: str
    licence: str = APACHE
    normalization: str = "inception"
    labels: str | None = None
    representation_size: int | None = None
    norm_epsilon: float = 1e-6
    aliases: tuple = ()
    sha256: str | None = None
    note: str = ""


def _augreg(run, fine_tune=None):
    """An AugReg file's URL: the pre-training run, then the ImageNet-1k fine-tuning run where there is one."""
    return f"{GCS}augreg/{run}" + (f"--imagenet2012-steps_20k-{fine_tune}.npz" if fine_tune else ".npz")


# The AugReg pre-training runs these files come from (one recipe a model; timm's choice for 224).
TI16 = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
S16 = "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
S32 = "S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
B16 = "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
B32 = "B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0"
B32_LIGHT = "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
B8 = "B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
L16 = "L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1"
R26_S32 = "R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0"
R26_S32_LIGHT = "R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1"
R50_L32 = "R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0"
R50_L32_MEDIUM = "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1"
S16_1K = "S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0"
B16_1K = "B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1"
B32_1K = "B_32-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.1-sd_0.1"

O21K, O1K = ORIGINAL + "imagenet21k", ORIGINAL + "imagenet21k+imagenet2012"
ONE_K = dict(num_classes=1000, labels=IMAGENET_1K)
AUGREG_21K = dict(num_classes=21843, pretraining=IN21K, note=NO_21K_LABELS, source=AUGREG)
AUGREG_1K = dict(ONE_K, pretraining=IN21K_1K, source=AUGREG)
ORIGINAL_21K = dict(num_classes=21843, pretraining=IN21K, source=O21K, note=f"{ZERO_HEAD}; {NO_21K_LABELS}")
ORIGINAL_1K = dict(ONE_K, pretraining=IN21K_1K, source=O1K)

PRESETS = (
    # Google's original release: the paper's checkpoints
    Preset("vit_base_patch16_224.orig_in21k", "vit_b16", GCS + "imagenet21k/ViT-B_16.npz", 224,
           representation_size=768, aliases=("vit_base_patch16_224_imagenet21k",), **ORIGINAL_21K),
    Preset("vit_base_patch32_224.orig_in21k", "vit_b32", GCS + "imagenet21k/ViT-B_32.npz", 224,
           representation_size=768, aliases=("vit_base_patch32_224_imagenet21k",), **ORIGINAL_21K),
    Preset("vit_large_patch16_224.orig_in21k", "vit_l16", GCS + "imagenet21k/ViT-L_16.npz", 224,
           representation_size=1024, aliases=("vit_large_patch16_224_imagenet21k",), **ORIGINAL_21K),
    Preset("vit_large_patch32_224.orig_in21k", "vit_l32", GCS + "imagenet21k/ViT-L_32.npz", 224,
           representation_size=1024, aliases=("vit_large_patch32_224_imagenet21k",), **ORIGINAL_21K),
    Preset("vit_huge_patch14_224.orig_in21k", "vit_h14", GCS + "imagenet21k/ViT-H_14.npz", 224,
           representation_size=1280, aliases=("vit_huge_patch14_224_imagenet21k",), **ORIGINAL_21K),
    Preset("vit_base_r50_s16_224.orig_in21k", "vit_r50_b16", GCS + "imagenet21k/R50+ViT-B_16.npz", 224,
           representation_size=768, **ORIGINAL_21K),
    Preset("vit_base_patch16_224.orig_in21k_ft_in1k", "vit_b16", GCS + "imagenet21k+imagenet2012/ViT-B_16-224.npz",
           224, aliases=("vit_base_patch16_224_imagenet",), **ORIGINAL_1K),
    Preset("vit_base_patch16_384.orig_in21k_ft_in1k", "vit_b16", GCS + "imagenet21k+imagenet2012/ViT-B_16.npz", 384,
           aliases=("vit_base_patch16_384_imagenet",), **ORIGINAL_1K),
    Preset("vit_base_patch32_384.orig_in21k_ft_in1k", "vit_b32", GCS + "imagenet21k+imagenet2012/ViT-B_32.npz", 384,
           aliases=("vit_base_patch32_384_imagenet",), **ORIGINAL_1K),
    Preset("vit_large_patch16_224.orig_in21k_ft_in1k", "vit_l16", GCS + "imagenet21k+imagenet2012/ViT-L_16-224.npz",
           224, aliases=("vit_large_patch16_224_imagenet",), **ORIGINAL_1K),
    Preset("vit_large_patch16_384.orig_in21k_ft_in1k", "vit_l16", GCS + "imagenet21k+imagenet2012/ViT-L_16.npz", 384,
           aliases=("vit_large_patch16_384_imagenet",), **ORIGINAL_1K),
    Preset("vit_large_patch32_384.orig_in21k_ft_in1k", "vit_l32", GCS + "imagenet21k+imagenet2012/ViT-L_32.npz", 384,
           aliases=("vit_large_patch32_384_imagenet",), **ORIGINAL_1K),
    Preset("vit_base_r50_s16_384.orig_in21k_ft_in1k", "vit_r50_b16",
           GCS + "imagenet21k+imagenet2012/R50+ViT-B_16.npz", 384, **ORIGINAL_1K),
    # AugReg (Steiner et al. 2021, "How to train your ViT?"): ImageNet-21k
    Preset("vit_tiny_patch16_224.augreg_in21k", "vit_ti16", _augreg(TI16), 224, **AUGREG_21K),
    Preset("vit_small_patch16_224.augreg_in21k", "vit_s16", _augreg(S16), 224, **AUGREG_21K),
    Preset("vit_small_patch32_224.augreg_in21k", "vit_s32", _augreg(S32), 224, **AUGREG_21K),
    Preset("vit_base_patch16_224.augreg_in21k", "vit_b16", _augreg(B16), 224, **AUGREG_21K),
    Preset("vit_base_patch32_224.augreg_in21k", "vit_b32", _augreg(B32), 224, **AUGREG_21K),
    Preset("vit_base_patch8_224.augreg_in21k", "vit_b8", _augreg(B8), 224, **AUGREG_21K),
    Preset("vit_large_patch16_224.augreg_in21k", "vit_l16", _augreg(L16), 224, **AUGREG_21K),
    Preset("vit_small_r26_s32_224.augreg_in21k", "vit_r26_s32", _augreg(R26_S32), 224,
           **dict(AUGREG_21K, source=AUGREG_HYBRID)),
    Preset("vit_large_r50_s32_224.augreg_in21k", "vit_r50_l32", _augreg(R50_L32), 224,
           **dict(AUGREG_21K, source=AUGREG_HYBRID)),
    # AugReg: ImageNet-21k, then ImageNet-1k at 224
    Preset("vit_tiny_patch16_224.augreg_in21k_ft_in1k", "vit_ti16", _augreg(TI16, "lr_0.03-res_224"), 224, **AUGREG_1K),
    Preset("vit_small_patch16_224.augreg_in21k_ft_in1k", "vit_s16", _augreg(S16, "lr_0.03-res_224"), 224, **AUGREG_1K),
    Preset("vit_small_patch32_224.augreg_in21k_ft_in1k", "vit_s32", _augreg(S32, "lr_0.03-res_224"), 224, **AUGREG_1K),
    Preset("vit_base_patch16_224.augreg_in21k_ft_in1k", "vit_b16", _augreg(B16, "lr_0.01-res_224"), 224, **AUGREG_1K),
    Preset("vit_base_patch32_224.augreg_in21k_ft_in1k", "vit_b32", _augreg(B32, "lr_0.03-res_224"), 224, **AUGREG_1K),
    Preset("vit_base_patch8_224.augreg_in21k_ft_in1k", "vit_b8", _augreg(B8, "lr_0.01-res_224"), 224, **AUGREG_1K),
    Preset("vit_large_patch16_224.augreg_in21k_ft_in1k", "vit_l16", _augreg(L16, "lr_0.01-res_224"), 224, **AUGREG_1K),
    Preset("vit_small_r26_s32_224.augreg_in21k_ft_in1k", "vit_r26_s32", _augreg(R26_S32_LIGHT, "lr_0.03-res_224"),
           224, **dict(AUGREG_1K, source=AUGREG_HYBRID)),
    Preset("vit_large_r50_s32_224.augreg_in21k_ft_in1k", "vit_r50_l32", _augreg(R50_L32_MEDIUM, "lr_0.01-res_224"),
           224, **dict(AUGREG_1K, source=AUGREG_HYBRID)),
    # AugReg: ImageNet-21k, then ImageNet-1k at 384
    Preset("vit_tiny_patch16_384.augreg_in21k_ft_in1k", "vit_ti16", _augreg(TI16, "lr_0.03-res_384"), 384, **AUGREG_1K),
    Preset("vit_small_patch16_384.augreg_in21k_ft_in1k", "vit_s16", _augreg(S16, "lr_0.03-res_384"), 384, **AUGREG_1K),
    Preset("vit_small_patch32_384.augreg_in21k_ft_in1k", "vit_s32", _augreg(S32, "lr_0.03-res_384"), 384, **AUGREG_1K),
    Preset("vit_base_patch16_384.augreg_in21k_ft_in1k", "vit_b16", _augreg(B16, "lr_0.01-res_384"), 384, **AUGREG_1K),
    Preset("vit_base_patch32_384.augreg_in21k_ft_in1k", "vit_b32", _augreg(B32_LIGHT, "lr_0.03-res_384"), 384,
           **AUGREG_1K),
    Preset("vit_large_patch16_384.augreg_in21k_ft_in1k", "vit_l16", _augreg(L16, "lr_0.01-res_384"), 384, **AUGREG_1K),
    Preset("vit_small_r26_s32_384.augreg_in21k_ft_in1k", "vit_r26_s32", _augreg(R26_S32, "lr_0.03-res_384"), 384,
           **dict(AUGREG_1K, source=AUGREG_HYBRID)),
    Preset("vit_large_r50_s32_384.augreg_in21k_ft_in1k", "vit_r50_l32", _augreg(R50_L32, "lr_0.01-res_384"), 384,
           **dict(AUGREG_1K, source=AUGREG_HYBRID)),
    # AugReg: ImageNet-1k only
    Preset("vit_small_patch16_224.augreg_in1k", "vit_s16", _augreg(S16_1K, "lr_0.01-res_224"), 224,
           **dict(AUGREG_1K, pretraining=IN1K)),
    Preset("vit_small_patch16_384.augreg_in1k", "vit_s16", _augreg(S16_1K, "lr_0.01-res_384"), 384,
           **dict(AUGREG_1K, pretraining=IN1K)),
    Preset("vit_base_patch16_224.augreg_in1k", "vit_b16", _augreg(B16_1K, "lr_0.01-res_224"), 224,
           **dict(AUGREG_1K, pretraining=IN1K)),
    Preset("vit_base_patch16_384.augreg_in1k", "vit_b16", _augreg(B16_1K, "lr_0.01-res_384"), 384,
           **dict(AUGREG_1K, pretraining=IN1K)),
    Preset("vit_base_patch32_224.augreg_in1k", "vit_b32", _augreg(B32_1K, "lr_0.01-res_224"), 224,
           **dict(AUGREG_1K, pretraining=IN1K)),
    Preset("vit_base_patch32_384.augreg_in1k", "vit_b32", _augreg(B32_1K, "lr_0.01-res_384"), 384,
           **dict(AUGREG_1K, pretraining=IN1K)),
    # Hugging Face: Google's ViT-B/16 (224, ImageNet-1k) as transformers' ViTForImageClassification
    Preset("hf-hub:google/vit-base-patch16-224", "vit_b16",
           "https://huggingface.co/google/vit-base-patch16-224/resolve/main/model.safetensors", 224,
           norm_epsilon=1e-12, aliases=("google/vit-base-patch16-224",),
           **dict(ORIGINAL_1K, source="huggingface.co/google/vit-base-patch16-224: model card (Apache-2.0), "
                  "config.json (layer_norm_eps 1e-12), preprocessor_config.json (mean = std = 0.5)")),
)

NAMES = {preset.name: preset for preset in PRESETS}
ALIASES = {alias: preset.name for preset in PRESETS for alias in preset.aliases}
# What a preset's model fixes: another value for one of these is refused (the checkpoint could not load).
ARCHITECTURE = ("patch_size", "hidden_size", "num_heads", "mlp_dim", "num_layers", "stem", "pooling",
                "position_embedding", "class_token")


def list_presets():
    """The names of the pretrained checkpoints (``create_model(NAME)``, ``train --weights NAME``)."""
    return sorted(NAMES)


def is_preset(value):
    """Whether ``value`` is a preset's name or alias."""
    return isinstance(value, str) and (value in NAMES or value in ALIASES)


def find_preset(value):
    """The Preset ``value`` names, or None (also where a file or folder of that name exists: the path wins)."""
    if not is_preset(value) or os.path.exists(value):
        return None
    return NAMES[ALIASES.get(value, value)]


def nearest_presets(name, count=3):
    """The preset names and aliases closest to ``name`` (difflib), best first, then those containing it."""
    names = [*NAMES, *ALIASES]
    near = difflib.get_close_matches(str(name), names, n=count, cutoff=0.6)
    near += [n for n in names if str(name).lower() in n.lower() and n not in near]
    return near[:count]


def get_preset(name):
    """The Preset of a name or alias; a ValueError naming the nearest ones otherwise."""
    if is_preset(name):
        return NAMES[ALIASES.get(name, name)]
    near = nearest_presets(name)
    hint = f"the nearest are {', '.join(near)}" if near else "none is close"
    raise ValueError(f"Unknown preset {name!r}: {hint}. vit_keras.list_presets() (or `vit-keras presets`) lists "
                     f"all {len(NAMES)}.")


def preset_labels(name):
    """A preset's class names (index order), or None where vit_keras ships no list for them (ImageNet-21k)."""
    preset = get_preset(name)
    return None if preset.labels is None else shipped_labels(preset.labels)


def shipped_labels(file_name):
    """The class names of a label list that ships in vit_keras.weights, one a line, in index order."""
    text = resources.files("vit_keras.weights").joinpath(file_name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def check_architecture(preset, model_name, given, key="model_name"):
    """Refuse a model name or architecture values (``given``: name -> value, None = unset) that differ from
    what ``preset``'s checkpoint was trained as, naming both."""
    from vit_keras.models.configs import model_config

    if model_name is not None and model_name != preset.model:
        raise ValueError(f"`{key}`={model_name!r} conflicts with preset {preset.name!r}, a {preset.model}: drop "
                         f"`{key}` (the preset brings its model) or choose a preset of {model_name}.")
    config = dict(model_config(preset.model), pooling="token", position_embedding="learned", class_token=True)
    clashes = [f"`{key}`={given[key]!r} (the preset's is {config[key]!r})" for key in ARCHITECTURE
               if given.get(key) is not None and given[key] != config[key]]
    if clashes:
        raise ValueError(f"Preset {preset.name!r} is a {preset.model} and cannot load into another architecture: "
                         f"{', '.join(clashes)}. Drop {'these' if len(clashes) > 1 else 'it'}, or train that "
                         "architecture from scratch without the preset.")


def preset_arguments(name, weights, arguments):
    """create_model's (model name, weights, arguments) where ``name`` or ``weights`` names a preset.

    The preset fills what was left unset (None): image_size, num_classes, its normalization and layer-norm
    epsilon, and its pre_logits width where the head is its own; a model name or architecture that differs
    from the preset's is refused (``check_architecture``).
    """
    from vit_keras.models.configs import list_models

    preset = find_preset(name)
    if preset is not None:
        if weights is not None and find_preset(weights) is not preset:
            raise ValueError(f"Preset {name!r} brings its own weights; got `weights`={weights!r} too: pass one.")
        name = None
    else:
        preset = find_preset(weights)
    if preset is None:
        near = nearest_presets(name)
        raise ValueError(f"Unknown model name {name!r}; valid names are {', '.join(list_models())}, or a preset"
                         + (f" (the nearest: {', '.join(near)})" if near else " (vit_keras.list_presets())") + ".")
    check_architecture(preset, name, arguments, key="name")
    filled = dict(arguments)
    for key, value in (("image_size", preset.image_size), ("num_classes", preset.num_classes),
                       ("norm_epsilon", preset.norm_epsilon)):
        filled[key] = value if filled.get(key) is None else filled[key]
    if filled.get("pixel_mean") is None and filled.get("pixel_std") is None:
        filled["pixel_mean"] = preset.normalization
    own_head = filled.get("include_top", True) and filled["num_classes"] == preset.num_classes
    if own_head and preset.representation_size and filled.get("representation_size") is None:
        filled["representation_size"] = preset.representation_size
    if own_head and preset.labels and filled.get("class_names") is None:
        filled["class_names"] = shipped_labels(preset.labels)
    return preset.model, preset.name, filled
