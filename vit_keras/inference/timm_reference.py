"""timm's models served for timing (``served.Served``): builds and warms each name, prints {"names": [...]} once
ready, then answers each name read from stdin with the seconds of one batch through it. Used by `vit-keras
bench`, which runs this file by path in an interpreter that has timm and times it in turns with ours (it
imports nothing of vit_keras).

Needs torch and timm (pip install torch==2.14.1 torchvision==0.29.1 timm); not part of CI.
"""

import argparse
import json
import os
import sys
import time


def main():
    # Run by path, Python puts this package's folder first on sys.path; its module names must not shadow torch's.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]
    import timm
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="+")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()

    models, images = {}, torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    with torch.inference_mode():
        for name in args.names:
            models[name] = timm.create_model(name, pretrained=False, img_size=args.image_size).eval()
            for _ in range(2):
                models[name](images)
        print(json.dumps({"names": args.names}), flush=True)
        for line in sys.stdin:
            start = time.perf_counter()
            models[line.strip()](images)
            print(json.dumps(time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
