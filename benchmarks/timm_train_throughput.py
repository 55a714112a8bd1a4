"""timm's training images/s for ViT-Ti/16 at 224, batch 32 (AdamW, one process); prints one JSON line.

Run with the reference environment, beside `benchmarks/train_fashion_mnist.py --vit-ti`:
  /work/.venv-ref/bin/python benchmarks/timm_train_throughput.py
Needs torch and timm; not part of CI or the library.
"""

import argparse
import json
import os
import time

import timm
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="vit_tiny_patch16_224")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
model = timm.create_model(args.model, pretrained=False, num_classes=1000).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
loss_fn = torch.nn.CrossEntropyLoss()
images = torch.randn(args.batch_size, 3, 224, 224)
labels = torch.randint(0, 1000, (args.batch_size,))


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(images), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


for _ in range(2):
    step()
load_before, cpu_before, start = os.getloadavg(), sum(os.times()[:2]), time.perf_counter()
for _ in range(args.steps):
    step()
wall, cpu = time.perf_counter() - start, sum(os.times()[:2]) - cpu_before
n = args.batch_size * args.steps
print(json.dumps(dict(model=args.model, batch_size=args.batch_size, steps=args.steps, img_per_s=round(n / wall, 2),
                      img_per_cpu_s_x_cores=round(n / cpu * os.cpu_count(), 2), threads=torch.get_num_threads(),
                      loadavg_before=load_before, loadavg_after=os.getloadavg())))
