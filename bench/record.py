"""Record the measurements shipped in cache/: every conv kernel (F, BD, BF) of the built-in
networks, every algorithm at every micro-batch size of the policy, on this GPU, into
`<OUT>/<gpu>-cudnn<version>.db` (e.g. cache/nvidia-h100-80gb-hbm3-cudnn91900.db).

    python3 bench/record.py --out cache [--specs alexnet:256:float32:nchw:powerOfTwo,...] [--execution graph]
        [--backend all|engines|legacy]

Specs run in order and each kernel is stored as soon as it is measured, so an interrupted run
keeps what it did and a second run measures only what is missing.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from ucudnn.core.nets import get_network
from ucudnn.measure.benchmark import CudnnBenchmarker
from ucudnn.measure.cache import Cache
from ucudnn.plan.config import Settings
from ucudnn.plan.sources import complete_tables

# net:batch:dtype:layout:policy; fp16 in NHWC, the layout its tensor-core kernels want, with
# tensor-op math (the default math of half types, problem.default_math). Each built-in network's
# default_batch (ucudnn/core/nets/builtin.py) must be among these: it is what commands plan at.
# (torchvision:alexnet is traced from torchvision: the recording needs it installed, planning
# from the file needs it too)
NETS = ("alexnet:256", "resnet18:128", "resnet50:32", "resnet50:64", "densenet40:256", "googlenet:128",
        "c3d:16", "unet3d:2", "wav2vec:16", "torchvision:alexnet:256")
DEFAULT_SPECS = ",".join(
    f"{net}:{dtype}:powerOfTwo" for dtype in ("float16:nhwc", "float32:nchw") for net in NETS
) + ",alexnet:256:float32:nchw:all"


def database_name(gpu_name: str, cudnn_version: int) -> str:
    """'NVIDIA H100 80GB HBM3', 91900 -> 'nvidia-h100-80gb-hbm3-cudnn91900.db'."""
    return f"{re.sub(r'[^a-z0-9]+', '-', gpu_name.lower()).strip('-')}-cudnn{cudnn_version}.db"


def record(spec: str, cache: Cache, bench: CudnnBenchmarker, backend: str = "") -> dict:
    net, batch, dtype, layout, policy = spec.rsplit(":", 4)  # the net may hold a colon
    kernels = get_network(net).problems(int(batch), dtype, layout=layout)
    start, calls = time.perf_counter(), bench.calls
    settings = Settings(policy=policy, backend=backend, search="full")  # as `ucudnn bench` fills a database
    complete_tables([k.problem for k in kernels], settings, None, cache, bench)  # the batch is a policy size
    summary = dict(spec=spec, kernels=len(kernels), measured=bench.calls - calls,
                   seconds=round(time.perf_counter() - start, 1))
    print(json.dumps(summary), flush=True)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="cache", help="folder of the database (default cache/)")
    parser.add_argument("--specs", default=DEFAULT_SPECS, help="net:batch:dtype:layout:policy,...")
    parser.add_argument("--execution", choices=("graph", "direct"), default="graph",
                        help="the execution the times are for (both live in one file)")
    parser.add_argument("--backend", choices=("all", "engines", "legacy"), default="",
                        help="where candidates come from (default: all where the frontend imports)")
    args = parser.parse_args(argv)
    bench = CudnnBenchmarker(execution=args.execution, backend=args.backend)
    path = Path(args.out) / database_name(bench.device.gpu_name, bench.device.cudnn_version)
    print(f"{bench.device.describe()} -> {path}", flush=True)
    cache = Cache(path)
    for spec in args.specs.split(","):
        record(spec, cache, bench, args.backend)
    cache.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
