"""`vit-keras bench`: inference images/s of ViT-Ti/S/B at 224, XLA on and off, against the matmul peak and timm."""

HELP = "inference throughput of ViT-Ti/16, S/16, B/16 (XLA on/off), share of the fp32 matmul peak, and timm's, same run"


def add_arguments(parser):
    parser.add_argument("--models", nargs="+", default=["vit_ti16", "vit_s16", "vit_b16"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timm-python", help="an interpreter that has torch and timm (default: this one)")


def run(args):
    from vit_keras.inference.bench import main

    main(args.models, args.batch_size, args.image_size, args.repeats, args.timm_python)
    return 0
