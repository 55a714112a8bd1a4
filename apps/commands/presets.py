"""`vit-keras presets`: the named pretrained checkpoints (vit_keras.weights.presets) as a table, or one in full."""

import dataclasses
import os

HELP = "List the named pretrained checkpoints (train --weights NAME, create_model(NAME)), or show one in full."

COLUMNS = ("name", "model", "size", "classes", "pretrained on", "labels", "cached")


def add_arguments(parser):
    parser.add_argument("name", nargs="?", default=None,
                        help="a preset (or alias): show all its facts, its URL and where its file is cached")
    parser.add_argument("--match", default=None, metavar="TEXT",
                        help="only the presets whose name, alias, model or pre-training contains TEXT")


def rows(presets):
    from vit_keras.weights.fetch import cache_path

    for preset in presets:
        labels = "ImageNet-1k" if preset.labels else "none shipped"
        cached = "yes" if os.path.isfile(cache_path(preset.url)) else "no"
        yield (preset.name, preset.model, str(preset.image_size), f"{preset.num_classes:,}", preset.pretraining,
               labels, cached)


def table(presets):
    """A Markdown table of ``presets``, one line each."""
    lines = [COLUMNS, *rows(presets)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    text = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(text)


def details(preset):
    from vit_keras.weights.fetch import MIRROR_ENV, cache_path, mirror_location

    facts = dataclasses.asdict(preset)
    facts["aliases"] = ", ".join(preset.aliases) or "none"
    facts["sha256"] = preset.sha256 or "none recorded (none is published): the download is checked for length only"
    facts["labels"] = preset.labels or "none shipped"
    facts["representation_size"] = preset.representation_size or "none (no pre_logits layer)"
    facts["cached at"] = cache_path(preset.url) + ("" if os.path.isfile(cache_path(preset.url)) else " (not yet)")
    mirror = mirror_location(preset.url)
    if mirror:
        facts[f"mirror ({MIRROR_ENV})"] = mirror
    width = max(map(len, facts))
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in facts.items() if value != "")


def run(args):
    from vit_keras.weights.presets import NAMES, get_preset

    if args.name:
        print(details(get_preset(args.name)))
        return 0
    presets = list(NAMES.values())
    if args.match:
        text = args.match.lower()
        presets = [p for p in presets if any(text in field.lower() for field in
                                             (p.name, p.model, p.pretraining, *p.aliases))]
        if not presets:
            raise ValueError(f"--match {args.match!r}: no preset's name, alias, model or pre-training contains it.")
    print(table(presets))
    print(f"\n{len(presets)} presets. Use one: vit-keras train --weights NAME, vit_keras.create_model(NAME); "
          "its URL, licence, source and aliases (keras-hub's names): vit-keras presets NAME.")
    return 0
