"""torch's own convolution timings, kept in the benchmark database so that a later process
decides delegation as the first did, without timing torch again.

A timing is kept only where torch chose its plan with nothing out of reach (delegation.ROOMY_BYTES
free), and read only where as much is free again: then it describes torch's unconstrained pick of
that torch version on that GPU model and cuDNN version, not the moment. Rows are candidates of the
database's `torch` backend (ucudnn.measurements.TORCH), named by torch's version."""
from __future__ import annotations

import math

import torch

from ...backends.base import candidate_id
from ...measurements import TORCH, Measurement
from ...problem import ConvProblem
from .delegation import ROOMY_BYTES
from .kernels import TorchTiming


def torch_candidate() -> str:
    """'torch:2.11.0+cu130': torch's own convolution as this torch runs it."""
    return candidate_id(TORCH, torch.__version__)


def stored_timing(assignments, problem: ConvProblem, free: int) -> TorchTiming | None:
    """The kept timing of torch's own `problem`, where `free` bytes are at least ROOMY_BYTES and
    the database of `assignments` (a Handle's) holds one; else None."""
    if free < ROOMY_BYTES:
        return None
    own = torch_candidate()
    found = [m for m in assignments.cache.table(problem, assignments.benchmarker.device).at(problem.batch)
             if m.algo == own and m.available]
    return TorchTiming(found[0].time_ms, found[0].workspace, free) if found else None


def keep_timing(assignments, problem: ConvProblem, timing: TorchTiming) -> None:
    """Keep `timing` of torch's own `problem` in the database of `assignments`, where it was taken
    with ROOMY_BYTES free and torch's kernel ran."""
    if timing.free >= ROOMY_BYTES and math.isfinite(timing.ms):
        assignments.cache.record(problem, assignments.benchmarker.device,
                                 [Measurement(torch_candidate(), problem.batch, timing.ms, timing.workspace)])
