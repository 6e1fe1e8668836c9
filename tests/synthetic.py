"""Made-up but plausible measurements, so that planning and the CLI can be tested without a GPU.

Faster algorithms need workspace in proportion to the micro-batch, and every call has a fixed
overhead: under a tight limit, WR splits the batch to use them, as on real GPUs.
"""
from __future__ import annotations

from ucudnn.core.accumulation import accumulates
from ucudnn.core.device import Provenance
from ucudnn.core.measurements import OK, UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.problem import ConvProblem
from ucudnn.execute.backends.legacy import legacy_id
from ucudnn.plan.config import batch_sizes

DEVICE = Provenance("Synthetic GPU", "9.0", 90100, 0, host="test", execution="graph")

# algo: (GFLOP/s, overhead ms, workspace bytes per byte of one input sample per sample); None: unsupported
# by the legacy algorithm number whose name (per kind) the measurements carry
ALGORITHMS = {0: (4e3, 0.010, 0), 1: (7e3, 0.020, 0.01), 2: (2e4, 0.050, 4), 3: None, 4: (1.4e4, 0.030, 1)}


def measurements(problem: ConvProblem, sizes) -> list[Measurement]:
    rows = []
    for b in sizes:
        micro = problem.with_batch(b)
        for number, model in ALGORITHMS.items():
            algo = legacy_id(problem.kind, number)
            summed = accumulates(problem, b)
            if model is None:
                rows.append(Measurement(algo, b, None, 0, UNSUPPORTED, accumulates=summed))
                continue
            rate, overhead, per_byte = model
            time_ms = micro.flops() / rate / 1e6 + overhead
            rows.append(Measurement(algo, b, time_ms, int(per_byte * b * problem.sample_bytes("x")), OK, 3, summed))
    return rows


def table(problem: ConvProblem, policy: str = "powerOfTwo") -> KernelTable:
    return KernelTable(measurements(problem, batch_sizes(policy, problem.batch)))


def record_network(database, kernels, policy: str = "powerOfTwo") -> None:
    """Store synthetic measurements of every kernel in a BenchmarkDatabase."""
    for kernel in kernels:
        problem = kernel.problem
        database.record(problem, DEVICE, measurements(problem, batch_sizes(policy, problem.batch)))
