"""The legacy backend: cuDNN's legacy convolution API, one candidate per algorithm."""
from __future__ import annotations

from ..bindings import cudnn
from ..bindings.convolution import workspace_size
from ..bindings.enums import algo_count, algo_name, refuses_problem
from ..bindings.executor import CudnnExecutor
from ..dispatch import Call, Step
from ..errors import CudnnError
from ..measurements import FAILED, OK, UNSUPPORTED
from ..problem import ConvProblem
from .base import Candidate, candidate_id

NAME = "legacy"


def legacy_id(kind, algo: int) -> str:
    """'legacy:FFT_TILING' for algorithm 5 of a forward kernel."""
    return candidate_id(NAME, algo_name(kind, algo))


def failure(exc: CudnnError) -> str:
    """The status of a measurement cuDNN refused (unsupported) or failed to run."""
    return UNSUPPORTED if refuses_problem(exc.status) else FAILED


class LegacyBackend:
    """Candidates and calls on one cuDNN handle. Legacy calls take alpha and beta themselves,
    so backward-filter micro-batches accumulate into dw with beta = 1 and need no buffer."""

    name = NAME

    def __init__(self, handle):
        self.handle = handle
        self.executor = CudnnExecutor(handle)

    def candidates(self, problem: ConvProblem, batch: int) -> list[Candidate]:
        descs = self.executor.descriptors(problem)
        found = []
        for algo in range(algo_count(problem.kind)):
            try:
                found.append(Candidate(legacy_id(problem.kind, algo),
                                       workspace_size(self.handle, problem.kind, descs, algo), OK))
            except CudnnError as exc:
                found.append(Candidate(legacy_id(problem.kind, algo), 0, failure(exc)))
        return found

    def prepare(self, step: Step) -> Call:
        return self.executor.prepare(step)

    def set_stream(self, stream: int) -> None:
        cudnn.set_stream(self.handle, stream)

    def release(self) -> None:
        """Nothing is built to measure: descriptors are kept for the calls that use them."""
