"""Networks of made-up measurements for WD and the desirable sets: cuDNN's forward algorithms'
shapes with per-kernel noise, at ResNet-50's size by default; and a recorded network's kernels with
their measurements from a benchmark database (identical layers as one kernel with a count)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ucudnn.core.measurements import UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.problem import ConvKind, ConvProblem, Kernel
from ucudnn.plan.config import batch_sizes

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
    from ucudnn.core.nets import get_network
    from ucudnn.measure.cache.database import BenchmarkDatabase

    kernels = get_network(network).problems(batch)
    with BenchmarkDatabase(database, readonly=True) as db:
        devices = [d for d in db.devices() if gpu is None or gpu.lower() in d.gpu_name.lower()]
        if not devices:
            raise SystemExit(f"{database} holds no measurements{f' on a {gpu}' if gpu else ''}")
        tables = db.tables([k.problem for k in kernels], devices[0])
    return kernels, tables
