"""`vit-keras prepare`: write a folder of images as shards that training streams fast (`--data shards:DIR`)."""

HELP = "Decode and resize a folder of images once into TFRecord shards that `train --data shards:DIR` streams."

from vit_keras.constants import IMAGES_PER_SHARD, SHARD_ENCODINGS, VAL_FRACTION


def add_arguments(parser):
    parser.add_argument("--data", required=True,
                        help="folder:PATH: one sub-folder per class, or train/ (val/, test/) folders of them")
    parser.add_argument("--out", required=True, help="a new or empty folder for the shards and their shards.json")
    parser.add_argument("--image-size", type=int, required=True,
                        help="the side the images are resized to: the input size of the model that trains on them")
    parser.add_argument("--encoding", choices=SHARD_ENCODINGS, default="png",
                        help="png: exactly the pixels training decodes from the folder; jpeg: smaller, lossy "
                             "(default: %(default)s)")
    parser.add_argument("--images-per-shard", type=int, default=None, metavar="N",
                        help=f"images in each shard file (default: {IMAGES_PER_SHARD})")
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION,
                        help="the held-out fraction of a folder without val/ or test/ folders, as `train` holds out "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the held-out part's seed, and the images' order (default: %(default)s)")


def run(args):
    from vit_keras.data.prepare import prepare

    manifest = prepare(args.data, args.out, args.image_size, seed=args.seed, val_fraction=args.val_fraction,
                       encoding=args.encoding, images_per_shard=args.images_per_shard or IMAGES_PER_SHARD)
    counts = ", ".join(f"{name} {sum(entry['counts']):,} images in {len(entry['files'])} file(s)"
                       for name, entry in manifest["splits"].items())
    print(f"Wrote shards of {args.data} at {args.image_size}x{args.image_size} to {args.out}: {counts}"
          + (f"; skipped {len(manifest['skipped'])} unreadable image(s)" if manifest["skipped"] else "")
          + f". Train on them with --data shards:{args.out}")
    return 0
