"""Where the engine sweep's plan building goes, and whether it parallelises: Caffe AlexNet B=256
fp32 NCHW, F/BD/BF at micro-batches 256, 32 and 4 (45 graphs). Each mode runs in a fresh
process, since cuDNN keeps runtime-compiled kernels within a process (a second build of the same
graph is cheap), and the first process on a machine fills CUDA's JIT cache on disk: so a serial
warm-up, then threaded, serial, threaded, serial. `serial` makes each graph (heuristics) and
builds every plan one by one, timed per engine; `threaded` does the same on --threads threads,
a handle each. Prints one JSON object. On the H100 (2026-11-24): cold 16.7 s; warm, serial
2.86-2.99 s, threaded 3.59-4.02 s, so the benchmarker builds in line.

    PYTHONPATH=. python3 bench/build_probe.py [--threads 8]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from ucudnn import gpu
from ucudnn.backends.engines import EnginesBackend, KernelGraph
from ucudnn.nets import get_network

SIZES = (256, 32, 4)


def problems():
    return [k.problem.with_batch(b) for k in get_network("alexnet").problems(256) for b in SIZES]


def build_all(graph: KernelGraph) -> dict[str, float]:
    seconds = {}
    for name in graph.index:
        began = time.perf_counter()
        graph.build(name)
        seconds[name] = time.perf_counter() - began
    return seconds


def serial() -> dict:
    backend = EnginesBackend()
    began = time.perf_counter()
    graphs = [KernelGraph(backend.fe, p, backend.handle) for p in problems()]
    made = time.perf_counter() - began
    by_engine, plans = defaultdict(float), 0
    for graph in graphs:
        for name, seconds in build_all(graph).items():
            by_engine[name.split("_")[0]] += seconds
            plans += 1
    top = sorted(by_engine.items(), key=lambda item: -item[1])[:6]
    return dict(graphs=len(graphs), plans=plans, graphs_and_heuristics_s=made,
                total_s=time.perf_counter() - began, slowest_engines_s=top,
                workspaces={g.problem.key: g.built for g in graphs})


def threaded(threads: int) -> dict:
    """The graphs split among `threads` threads, each on a frontend handle of its own (a handle
    is not for concurrent use) and on the caller's device."""
    backend = EnginesBackend()
    fe, device = backend.fe, gpu.cupy().cuda.runtime.getDevice()
    handles = [fe.create_handle() for _ in range(threads)]
    todo = problems()

    def build(worker: int) -> list[KernelGraph]:
        gpu.cupy().cuda.runtime.setDevice(device)  # a new thread starts on device 0
        graphs = [KernelGraph(fe, p, handles[worker]) for p in todo[worker::threads]]
        for graph in graphs:
            build_all(graph)
        return graphs

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        graphs = [g for group in pool.map(build, range(threads)) for g in group]
    total = time.perf_counter() - began
    return dict(threads=threads, total_s=total, workspaces={g.problem.key: g.built for g in graphs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--mode", choices=("serial", "threaded"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(serial() if args.mode == "serial" else threaded(args.threads)))
        return
    # the first process pays the machine's cold caches (CUDA's JIT cache on disk): a warm-up
    runs = []
    for mode in ("serial", "threaded", "serial", "threaded", "serial"):
        done = subprocess.run([sys.executable, __file__, "--mode", mode, "--threads", str(args.threads)],
                              capture_output=True, text=True, check=True)
        runs.append(dict(mode=mode, **json.loads(done.stdout.strip().splitlines()[-1])))
    workspaces = [run.pop("workspaces") for run in runs]
    timed = runs[1:]
    best = {mode: min(r["total_s"] for r in timed if r["mode"] == mode) for mode in ("serial", "threaded")}
    print(json.dumps(dict(runs=runs, same_workspaces=all(w == workspaces[0] for w in workspaces),
                          best_s=best, speedup=best["serial"] / best["threaded"]), indent=1))


if __name__ == "__main__":
    main()
