"""WR (workspace reuse, paper III-B): per kernel, dynamic programming over micro-batch sizes.

    T1(b) = min { t(a, b) : a available, ws(a, b) <= M }      for b in S
    T(0)  = 0
    T(b)  = min over b' in S, b' <= b, T(b - b') defined, of T(b - b') + T1(b')

With a batch quantum q > 1 (ConvProblem.batch_quantum) the recursion runs over the sizes that
are multiples of q, and one part of any size may end the configuration: every micro-batch then
starts at a multiple of q samples, so its slices are aligned like the buffer they come from.
"""
from __future__ import annotations

from typing import Iterable

from ..errors import ConfigError, NoAlgorithmError
from ..measurements import KernelTable
from .configuration import Configuration, MicroConfig


def check_quantum(quantum: int) -> None:
    if isinstance(quantum, bool) or not isinstance(quantum, int) or quantum < 1:
        raise ConfigError(f"batch quantum {quantum!r} must be a positive integer (1: any split)")


def optimize_wr(table: KernelTable, batch: int, sizes: Iterable[int], limit: int | None,
                kernel: str = "kernel", quantum: int = 1) -> Configuration:
    """The fastest configuration of `batch` samples from micro-batches in `sizes` whose every
    part fits `limit` bytes of workspace (None: unlimited); every part but the last has a size
    that is a multiple of `quantum`. Parts run in the returned order."""
    check_quantum(quantum)
    best_single: dict[int, MicroConfig] = {}
    for b in sorted(set(sizes)):
        m = table.fastest(b, limit) if b <= batch else None
        if m is not None:
            best_single[b] = MicroConfig(m.algo, b, m.time_ms, m.workspace)
    # larger parts first so that ties keep fewer calls
    candidates = sorted(best_single.values(), key=lambda m: -m.batch)
    total, last = _aligned_dp([m for m in candidates if m.batch % quantum == 0], batch)
    tail, best = None, total[batch]
    for part in candidates:  # one part of any size may come last
        rest = batch - part.batch
        if part.batch % quantum and rest >= 0 and total[rest] is not None:
            if best is None or total[rest] + part.time_ms < best:
                tail, best = part, total[rest] + part.time_ms
    if best is None:
        raise NoAlgorithmError(
            f"no algorithm of {kernel} runs within {limit} bytes of workspace at micro-batch sizes "
            f"{sorted(best_single) or 'any'} that sum to {batch}; raise the workspace limit or use "
            "a batch size policy with more sizes"
        )
    parts, b = [], batch - (tail.batch if tail else 0)
    while b:
        parts.append(last[b])
        b -= last[b].batch
    return Configuration((*sorted(parts, key=lambda m: -m.batch), *([tail] if tail else [])))


def _aligned_dp(candidates: list[MicroConfig], batch: int) -> tuple[list, list]:
    """T(b) and the last part of its argmin for b in 0..batch, from `candidates` only."""
    total: list[float | None] = [0.0] + [None] * batch
    last: list[MicroConfig | None] = [None] * (batch + 1)
    for b in range(1, batch + 1):
        for part in candidates:
            rest = b - part.batch
            if rest < 0 or total[rest] is None:
                continue
            time = total[rest] + part.time_ms
            if total[b] is None or time < total[b]:
                total[b], last[b] = time, part
    return total, last
