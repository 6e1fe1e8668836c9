"""Does accumulating (beta = 1) change a backward-filter call's time? Dispatch runs every BF
micro-batch but the first with beta = 1; measurements were taken with beta = 0 until this probe
said yes (CudnnBenchmarker now times BF micro-batches accumulating). Times `calls` calls of one
micro-batch, captured in a CUDA graph, at beta 0 and at beta 1.

    python3 bench/beta_probe.py --out OUT
"""
from __future__ import annotations

import json

from probe_setup import graph_ms, problem_of, start, write_report

from ucudnn.benchmark import Scratch
from ucudnn.bindings.enums import ALGORITHMS
from ucudnn.bindings.executor import CudnnExecutor
from ucudnn.dispatch import Step
from ucudnn.graphs import cudnn_capturer

CASES = [("resnet50", 64, "layer3.0.downsample.0/BF", 2, "ALGO_1", 32),
         ("alexnet", 256, "conv4/BF", 4, "ALGO_1", 64),
         ("alexnet", 256, "conv5/BF", 10, "ALGO_1", 25)]


def main(argv=None) -> int:
    out, stream, handle = start(__doc__, argv)
    executor, capturer, rows = CudnnExecutor(handle), cudnn_capturer(handle, lambda: stream), []
    for net, batch, name, b, algo_name, calls in CASES:
        problem = problem_of(net, batch, name)
        micro = problem.with_batch(b)
        algo = ALGORITHMS[problem.kind].index(algo_name)
        scratch = Scratch()
        ptrs, workspace = scratch.operands(problem), scratch.workspace(256 * 2**20)
        row = dict(net=net, kernel=name, micro_batch=b, algo=algo_name, calls=calls)
        for beta in (0.0, 1.0):
            call = executor.prepare(Step(micro, algo, 0, 0, 0, 1.0, beta))
            row[f"beta{beta:g}_ms"] = graph_ms(capturer, stream, lambda: [
                call(ptrs["x"], ptrs["w"], ptrs["y"], workspace, 256 * 2**20) for _ in range(calls)], 2, 10)
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_report(out, "beta_probe.json", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
