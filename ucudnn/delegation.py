"""When a layer runs its framework's own convolution instead (delegation), and the timings of
that convolution kept in the benchmark database.

A converted call costs host time that the framework's own does not (in torch: a Python autograd
Function, the site lookup, a graph launch per kernel). In a training step that the host paces
(ResNet-50 in AMP: 53 short convolutions) that time is the step's time. So ucudnn takes a layer
only where it buys something: where the framework's own kernels need more workspace than the
limit allows (the reason ucudnn exists: they are not allowed to run), or where ucudnn's kernels
are faster than the framework's by more than the host time a converted step costs. Otherwise the
layer runs the framework's own convolution, with no cost beyond one lookup. Both sides are
measured in this process: ucudnn's kernels by its benchmark, the framework's by timing its own
convolution once per kernel (under the memory free then, as torch's benchmark mode sees it).

A timing is kept in the database only where the framework chose its plan with nothing out of
reach (ROOMY_BYTES free), and read only where as much is free again: then it describes the
framework's unconstrained pick (named by the framework's version, e.g. 'torch:2.11.0+cu130', a
candidate of the database's `torch` backend, ucudnn.measurements.TORCH) on that GPU model and
cuDNN version, not the moment. A later process then decides delegation as the first did.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

from .measurements import Measurement
from .problem import ConvProblem

# What a converted F+BD+BF step costs the host beyond torch's own layer, in ms: 0.35-0.49 ms
# synced vs torch's 0.04-0.17 ms per AlexNet layer, and 4.6 ms over ResNet-50's 53 layers in AMP
# (~0.09 ms a layer) on the H100's host (docs/torch.md). The smaller figure keeps ucudnn on a
# layer wherever its kernels win clearly.
HOST_COST_MS = 0.05


# Free memory (device free plus the framework's cached blocks) beyond which torch's benchmark mode
# is taken to have had every plan cuDNN offers within reach. A judgment, not a measured bound: a
# plan asking more than this for one convolution would be kept from torch unnoticed
# (docs/results.md, "Cold start on models nobody planned", says what is not yet measured).
ROOMY_BYTES = 4 * 2**30


class OwnTiming(NamedTuple):
    """The framework's own convolution of a kernel, as measured in this process: its median GPU
    time, the bytes it allocates beyond its result (the workspace of the plan it chose) and the
    bytes that could be had when it chose (device free plus its cached blocks; 0: unknown)."""

    ms: float
    workspace: int
    free: int = 0


def settled_by_own(own: Sequence[OwnTiming], limit: int, favourites_fit: Callable[[], bool]) -> bool:
    """Whether a layer runs the framework's own convolution with no sweep of ucudnn's candidates:
    each of its own kernels was timed (its operands fit) and fits the per-kernel workspace
    `limit`, and the framework chose it with nothing out of reach: with ROOMY_BYTES free, or else
    where cuDNN's heuristic favourite of each kernel fits the limit too (`favourites_fit()`, asked
    only then: it costs a heuristics query per kernel). Then no plan is kept out by the limit,
    which is all micro-batching can let in, and torch's benchmark mode has timed what cuDNN rates
    best. Under memory pressure with a favourite that does not fit (the framework settled for a
    slow plan), the sweep decides."""
    if not own or any(t.ms == math.inf or t.workspace > limit for t in own):
        return False
    return all(t.free >= ROOMY_BYTES for t in own) or favourites_fit()


def own_kernel_faster(ucudnn_ms: float, own: OwnTiming, limit: int) -> bool:
    """Whether one kernel of a layer ucudnn keeps runs the framework's own convolution instead:
    its own kernel was timed, fits the per-kernel workspace `limit` and is faster than ucudnn's
    plan (a plan the search could not find: a pruned search times cuDNN's best-ranked candidates,
    and torch's benchmark mode may find another that ranks lower)."""
    return own.ms < ucudnn_ms and own.workspace <= limit


def worth_delegating(ucudnn_ms: Sequence[float], own: Sequence[OwnTiming], limit: int,
                     host_cost_ms: float = HOST_COST_MS) -> bool:
    """Whether a layer whose kernels take `ucudnn_ms` through ucudnn and `own` (time and
    workspace) through the framework runs the framework's own convolution: every own kernel fits
    the per-kernel workspace `limit`, and ucudnn's kernels together save less than `host_cost_ms`."""
    if not own or any(t.workspace > limit for t in own):
        return False
    saving_ms = sum(t.ms for t in own) - sum(ucudnn_ms)
    return saving_ms < host_cost_ms


def stored_timing(assignments, problem: ConvProblem, free: int, candidate: str) -> OwnTiming | None:
    """The kept timing of the framework's own `problem` (its database name `candidate`), where
    `free` bytes are at least ROOMY_BYTES and the database of `assignments` (a Handle's) holds
    one; else None."""
    if free < ROOMY_BYTES:
        return None
    found = [m for m in assignments.cache.table(problem, assignments.benchmarker.device).at(problem.batch)
             if m.algo == candidate and m.available]
    return OwnTiming(found[0].time_ms, found[0].workspace, free) if found else None


def keep_timing(assignments, problem: ConvProblem, timing: OwnTiming, candidate: str) -> None:
    """Keep `timing` of the framework's own `problem` (its database name `candidate`) in the
    database of `assignments`, where it was taken with ROOMY_BYTES free and the kernel ran."""
    if timing.free >= ROOMY_BYTES and math.isfinite(timing.ms):
        assignments.cache.record(problem, assignments.benchmarker.device,
                                 [Measurement(candidate, problem.batch, timing.ms, timing.workspace)])
