"""Where the engine sweep's plan building goes, and whether it parallelises: Caffe AlexNet B=256
fp32 NCHW, F/BD/BF at micro-batches 256, 32 and 4 (45 graphs). Serial: graph + heuristics, then
every plan built one by one (timed per engine). Threaded: the same graphs made afresh, built by
THREADS threads, each on its own frontend handle (one handle is not for concurrent use). Prints
one JSON object.

    PYTHONPATH=. python3 bench/build_probe.py [--threads 8]
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    backend = EnginesBackend()
    fe = backend.fe
    began = time.perf_counter()
    graphs = [KernelGraph(fe, p, backend.handle) for p in problems()]
    made = time.perf_counter() - began
    by_engine, plans, failed = defaultdict(float), 0, 0
    began = time.perf_counter()
    for graph in graphs:
        for name, seconds in build_all(graph).items():
            by_engine[name.split("_")[0]] += seconds
            plans += 1
            failed += isinstance(graph.built[name], str)
    serial = time.perf_counter() - began

    handles = [fe.create_handle() for _ in range(args.threads)]
    fresh = [KernelGraph(fe, p, handles[i % args.threads]) for i, p in enumerate(problems())]
    groups = [fresh[i::args.threads] for i in range(args.threads)]
    began = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lambda group: [build_all(g) for g in group], groups))
    threaded = time.perf_counter() - began
    same = all(a.built == b.built for a, b in zip(graphs, fresh))
    top = sorted(by_engine.items(), key=lambda item: -item[1])[:12]
    print(json.dumps(dict(graphs=len(graphs), plans=plans, failed=failed, graphs_and_heuristics_s=made,
                          build_serial_s=serial, build_threaded_s=threaded, threads=args.threads,
                          same_workspaces=same, slowest_engines_s=top), indent=1))


if __name__ == "__main__":
    main()
