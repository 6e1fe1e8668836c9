"""Trace the shipped torchvision conv tables (ucudnn/core/nets/torchvision.json) where torch and
torchvision are installed: `PYTHONPATH=. python3 bench/torchvision_tables.py [--out PATH]`.
The models are the common ones a user names; any other is traced on demand."""
from __future__ import annotations

import argparse
import json

from ucudnn.core.nets import torchvision as tv

MODELS = ("alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "googlenet", "inception_v3",
          "mnasnet1_0", "mobilenet_v2", "mobilenet_v3_large", "regnet_y_400mf", "resnet18", "resnet34",
          "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_0",
          "vgg11", "vgg16", "vgg19", "wide_resnet50_2")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(tv.SHIPPED))
    args = parser.parse_args()
    content = tv.tables(list(MODELS))
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(content, file, indent=1, sort_keys=True)
        file.write("\n")
    print(f"{len(MODELS)} tables (torchvision {content['torchvision']}) -> {args.out}")
