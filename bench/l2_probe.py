"""Do micro-batches of memory-bound kernels run faster in the benchmark's sweep than in execution?

The graph benchmark times a micro-batch as a sweep of calls on one slice of the batch; execution
walks the slices of the whole batch. A slice small enough to stay in L2 (50 MB on an H100) is
read warm in the sweep, cold in execution. This times the same calls, B/b of them captured in one
CUDA graph, both ways: `same` repeats slice 0 (the sweep), `walk` runs slices 0, b, 2b, ... (the
executed configuration). Cases are the ResNet-50 B=64 kernels whose WR plans ran slower than
predicted, and AlexNet's worst prediction.

    python3 bench/l2_probe.py --out OUT
"""
from __future__ import annotations

import json
from dataclasses import replace

from probe_setup import graph_ms, problem_of, start, write_report

from ucudnn.benchmark import Scratch
from ucudnn.bindings.convolution import workspace_size
from ucudnn.bindings.descriptors import KernelDescriptors
from ucudnn.bindings.enums import ALGORITHMS
from ucudnn.bindings.executor import CudnnExecutor
from ucudnn.dispatch import steps
from ucudnn.graphs import cudnn_capturer
from ucudnn.optimizers.configuration import Configuration, MicroConfig

# (net, batch, kernel, micro-batch size, algorithm)
CASES = [("resnet50", 64, "layer1.0.conv1/BD", 16, "ALGO_1"),
         ("resnet50", 64, "layer1.0.conv3/BD", 8, "ALGO_1"),
         ("resnet50", 64, "layer1.1.conv1/F", 8, "IMPLICIT_PRECOMP_GEMM"),
         ("resnet50", 64, "layer1.0.conv2/F", 8, "IMPLICIT_PRECOMP_GEMM"),
         ("resnet50", 64, "layer3.1.conv2/F", 8, "IMPLICIT_PRECOMP_GEMM"),
         ("alexnet", 256, "conv2/F", 32, "IMPLICIT_PRECOMP_GEMM")]


def main(argv=None) -> int:
    out, stream, handle = start(__doc__, argv)
    executor, capturer, rows = CudnnExecutor(handle), cudnn_capturer(handle, lambda: stream), []
    for net, batch, name, b, algo_name in CASES:
        problem = problem_of(net, batch, name)
        algo = ALGORITHMS[problem.kind].index(algo_name)
        n = batch // b
        ws = workspace_size(handle, problem.kind, KernelDescriptors(problem.with_batch(b)), algo)
        scratch = Scratch()
        ptrs, workspace = scratch.operands(problem), scratch.workspace(ws)
        walk = steps(problem, Configuration(tuple(MicroConfig(algo, b, 0.0, ws) for _ in range(n))))
        same = [replace(step, x_offset=0, y_offset=0) for step in walk]

        def ms_per_call(steps) -> float:
            prepared = [executor.prepare(step) for step in steps]
            return graph_ms(capturer, stream, lambda: [call(ptrs["x"], ptrs["w"], ptrs["y"], workspace, ws)
                                                       for call in prepared], 3, 20, hide_host=True) / n

        row = dict(net=net, kernel=name, micro_batch=b, calls=n, algo=algo_name,
                   x_mb=round(problem.sample_bytes("x") * b / 1e6, 1), y_mb=round(problem.sample_bytes("y") * b / 1e6, 1))
        row["same_ms_per_call"] = ms_per_call(same)
        row["walk_ms_per_call"] = ms_per_call(walk)
        row["walk_over_same"] = row["walk_ms_per_call"] / row["same_ms_per_call"]
        scratch.release()
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_report(out, "l2_probe.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
