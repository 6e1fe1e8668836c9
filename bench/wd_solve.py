"""How long the WD optimizer takes: desirable sets, ILP variables, build and solve seconds.

    PYTHONPATH=. python bench/wd_solve.py [--database FILE.db [--network resnet50] [--gpu NAME]]
                             [--kernels 160] [--batch 32] [--policy powerOfTwo]
                             [--limit-per-kernel 16MiB | --limit 2544MiB] [--solver cbc] [--seed 0]

With --database it runs on recorded measurements of a network's kernels (identical layers as one
kernel with a count); without, on a synthetic network of ResNet-50's size (160 kernels).
`report(kernels, tables, ...)` times any kernels with their measurement tables.
"""
from __future__ import annotations

import argparse
import functools
import time
from typing import Sequence

import numpy as np


from ucudnn.plan.config import batch_sizes, format_size, parse_size
from ucudnn.core.measurements import UNSUPPORTED, KernelTable, Measurement
from ucudnn.optimizers.wd import WDResult, optimize_wd
from ucudnn.core.problem import ConvKind, ConvProblem, Kernel

Tables = dict[str, KernelTable]  # by problem.key

# Shapes of cuDNN's forward algorithms: time per sample relative to IMPLICIT_GEMM, the overhead
# of a call in samples' worth of time (small micro-batches run less efficiently), workspace per
# sample and per call in units of the kernel's activation bytes, and whether 3x3 only.
ALGORITHMS = (  # (name, time factor, overhead, workspace per sample, workspace per call, 3x3 only)
    ("IMPLICIT_GEMM", 1.00, 0.5, 0.0, 0.0, False),
    ("IMPLICIT_PRECOMP_GEMM", 0.75, 1.0, 0.0, 0.01, False),
    ("GEMM", 0.85, 1.0, 9.0, 0.0, False),
    ("DIRECT", None, 0, 0, 0, False),  # unsupported, as in cuDNN
    ("FFT", 0.55, 6.0, 12.0, 4.0, True),
    ("FFT_TILING", 0.65, 3.0, 4.0, 1.0, False),
    ("WINOGRAD", 0.60, 2.0, 0.0, 0.05, True),
    ("WINOGRAD_NONFUSED", 0.45, 4.0, 6.0, 0.5, True),
)


def synthetic_table(sizes: Sequence[int], ms_per_sample: float, activation: int, three_by_three: bool,
                    rng: np.random.Generator) -> KernelTable:
    table = KernelTable()
    for algo, (_, factor, overhead, ws_sample, ws_call, only_3x3) in enumerate(ALGORITHMS):
        for b in sizes:
            if factor is None or (only_3x3 and not three_by_three):
                table.add(Measurement(algo, b, None, 0, UNSUPPORTED))
                continue
            time_ms = ms_per_sample * factor * (b + overhead) * rng.uniform(0.97, 1.03)
            workspace = int(activation * (ws_sample * b + ws_call) * rng.uniform(0.9, 1.1))
            table.add(Measurement(algo, b, float(time_ms), workspace))
    return table


def synthetic_kernel(name: str, index: int, batch: int, count: int = 1) -> Kernel:
    """A kernel whose key is its index's own and whose samples all start on the slice alignment
    (ucudnn.core.staging: no copies), for measurements made up to go with it."""
    return Kernel(name, ConvProblem(ConvKind.FORWARD, (batch, index + 1, 8, 8), (64, index + 1, 1, 1)), count)


def synthetic_network(kernels: int = 160, batch: int = 32, policy: str = "powerOfTwo",
                      seed: int = 0) -> tuple[list[Kernel], Tables]:
    """Kernels of ResNet-50's spread and their tables: per-sample times from 0.01 to 1 ms,
    activations of 0.1 to 3 MiB per sample, one kernel in three a 3x3 convolution."""
    rng = np.random.default_rng(seed)
    sizes = batch_sizes(policy, batch)
    network = [synthetic_kernel(f"k{i}", i, batch) for i in range(kernels)]
    return network, {k.problem.key: synthetic_table(sizes, 10 ** rng.uniform(-2, 0),
                                                    int(2**20 * 10 ** rng.uniform(-1, 0.5)), i % 3 == 1, rng)
                     for i, k in enumerate(network)}


def recorded_network(database: str, network: str = "resnet50", batch: int = 32,
                     gpu: str | None = None) -> tuple[list[Kernel], Tables]:
    """The kernels of `network` with their measurements in `database`, on the first recorded
    device (or the first whose GPU name contains `gpu`)."""
    from ucudnn.measure.cache.database import BenchmarkDatabase
    from ucudnn.core.nets import get_network

    kernels = get_network(network).problems(batch)
    with BenchmarkDatabase(database, readonly=True) as db:
        devices = [d for d in db.devices() if gpu is None or gpu.lower() in d.gpu_name.lower()]
        if not devices:
            raise SystemExit(f"{database} holds no measurements{f' on a {gpu}' if gpu else ''}")
        tables = db.tables([k.problem for k in kernels], devices[0])
    return kernels, tables


def report(kernels: Sequence[Kernel], tables: Tables, policy: str, total_limit: int,
           solver: str = "cbc") -> WDResult:
    """Solve WD for `kernels` and print what it took."""
    start = time.perf_counter()
    result = optimize_wd(kernels, tables, functools.partial(batch_sizes, policy), total_limit, solver)
    wall = time.perf_counter() - start
    print(f"{len(kernels)} kernels, {policy}, limit {format_size(total_limit)}, solver {result.solver}")
    print(f"  desirable configurations: {sum(result.desirable_sizes.values())} "
          f"(max {max(result.desirable_sizes.values())} per kernel)")
    print(f"  ILP variables: {result.variables}")
    print(f"  build {result.build_seconds * 1e3:.1f} ms, solve {result.solve_seconds * 1e3:.1f} ms, "
          f"wall {wall * 1e3:.1f} ms")
    print(f"  total time {result.total_time_ms:.3f} ms, workspace {format_size(result.total_workspace)}")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", help="recorded measurements (SQLite); default: synthetic")
    parser.add_argument("--network", default="resnet50")
    parser.add_argument("--gpu", help="the recorded GPU to use (a part of its name)")
    parser.add_argument("--kernels", type=int, default=160)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--policy", default="powerOfTwo")
    parser.add_argument("--limit-per-kernel", default="16MiB", help="the total is this times the kernels")
    parser.add_argument("--limit", help="the total workspace limit (instead of --limit-per-kernel)")
    parser.add_argument("--solver", default="cbc")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.database:
        kernels, tables = recorded_network(args.database, args.network, args.batch, args.gpu)
    else:
        kernels, tables = synthetic_network(args.kernels, args.batch, args.policy, args.seed)
    limit = parse_size(args.limit) if args.limit else parse_size(args.limit_per_kernel) * len(kernels)
    report(kernels, tables, args.policy, limit, args.solver)


if __name__ == "__main__":
    main()
