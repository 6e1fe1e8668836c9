"""The legacy backend: cuDNN's legacy convolution API, one candidate per algorithm (for a
deterministic kernel, per algorithm cuDNN reports deterministic), in cuDNN's heuristic order."""
from __future__ import annotations

from collections.abc import Iterable

from ...core.accuracy import accurate
from ...core.errors import CudnnError
from ...core.measurements import OK, UNSUPPORTED, failure_status
from ...core.problem import ConvProblem
from ..bindings import cudnn
from ..bindings.convolution import get_algorithms, workspace_size
from ..bindings.enums import DETERMINISTIC, AlgoPerf, algo_count, algo_name, algo_number
from ..bindings.executor import CudnnExecutor
from ..dispatch import Plan, Step
from .base import Candidate, candidate_id, split_id

NAME = "legacy"
TASK_WEIGHT = 1  # measuring cost per task, the unit of the engines' (ucudnn.measure.parallel.tasks)
NO_CANDIDATE = candidate_id(NAME, "none")  # recorded where no algorithm may run the kernel


def legacy_id(kind, algo: int) -> str:
    """'legacy:FFT_TILING' for algorithm 5 of a forward kernel."""
    return candidate_id(NAME, algo_name(kind, algo))


def deterministic_algorithms(perfs: Iterable[AlgoPerf]) -> set[int]:
    """The algorithms cuDNN's perf results report deterministic for the kernel they describe
    (what torch's cudnn.deterministic also reads): cuDNN 9 documents backward-data ALGO_0 and
    backward-filter ALGO_0 and ALGO_3 as non-deterministic, but what it reports is the rule."""
    return {perf.algo for perf in perfs if perf.determinism == DETERMINISTIC}


class LegacyBackend:
    """Candidates and calls on one cuDNN handle. Legacy calls take alpha and beta themselves
    (float32 backward-filter micro-batches add into dw with beta = 1: ucudnn.core.accumulation)."""

    name = NAME
    blends = True

    def __init__(self, handle):
        self.handle = handle
        self.executor = CudnnExecutor(handle)

    def ranked(self, problem: ConvProblem) -> list[str]:
        """Candidate ids in cuDNN's heuristic order (cudnnGet*Algorithm_v7; algorithms it does
        not list follow in enum order); for a deterministic kernel only the algorithms cuDNN
        reports deterministic (none where it refuses to rank them); none that is not accurate
        enough for the kernel (ucudnn.core.accuracy); NO_CANDIDATE where none is left."""
        try:
            perfs = get_algorithms(self.handle, problem.kind, self.executor.descriptors(problem))
        except CudnnError:
            perfs = None
        if problem.deterministic:
            allowed = deterministic_algorithms(perfs or ())
            order = [p.algo for p in perfs or () if p.algo in allowed]
        else:
            order = [*(p.algo for p in perfs or ()), *range(algo_count(problem.kind))]
        ids = (legacy_id(problem.kind, algo) for algo in dict.fromkeys(order))
        return [c for c in ids if accurate(problem, c)] or [NO_CANDIDATE]

    def candidate(self, problem: ConvProblem, candidate: str) -> Candidate:
        """The candidate with its workspace (cudnnGet*WorkspaceSize), or why it cannot run."""
        if candidate == NO_CANDIDATE:
            return Candidate(NO_CANDIDATE, 0, UNSUPPORTED)
        algo = algo_number(problem.kind, split_id(candidate)[1])
        try:
            return Candidate(candidate, workspace_size(self.handle, problem.kind,
                                                       self.executor.descriptors(problem), algo), OK)
        except CudnnError as exc:
            return Candidate(candidate, 0, failure_status(exc))

    def prepare(self, step: Step) -> Plan:
        return self.executor.plan(step, algo_number(step.problem.kind, split_id(step.algo)[1]))

    def set_stream(self, stream: int) -> None:
        cudnn.set_stream(self.handle, stream)

    def release(self) -> None:
        """Nothing is built to measure: descriptors are kept for the calls that use them."""

    def close(self) -> None:
        """The cuDNN handle is the caller's: nothing of its own to free."""


def open_backend(cudnn_handle) -> LegacyBackend:
    return LegacyBackend(cudnn_handle)
