"""timm's inference images/s for the given model names; prints one JSON line. Used by `vit-keras bench`, which runs
this file by path in an interpreter that has them (it imports nothing of vit_keras).

Needs torch and timm (pip install torch==2.14.1 torchvision==0.29.1 timm); not part of CI.
"""

import argparse
import json
import os
import statistics
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
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rates = {}
    for name in args.names:
        model = timm.create_model(name, pretrained=False, img_size=args.image_size).eval()
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        with torch.inference_mode():
            for _ in range(2):
                model(images)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                model(images)
                times.append(time.perf_counter() - start)
        rates[name] = args.batch_size / statistics.median(times)
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
