"""WR (workspace reuse, paper III-B): per kernel, dynamic programming over micro-batch sizes.

    T1(b) = min { t(a, b) : a available, ws(a, b) <= M }      for b in S
    T(0)  = 0
    T(b)  = min over b' in S, b' <= b, T(b - b') defined, of T(b - b') + T1(b')
"""
from __future__ import annotations

from typing import Iterable

from ..errors import NoAlgorithmError
from ..measurements import KernelTable
from .configuration import Configuration, MicroConfig


def optimize_wr(table: KernelTable, batch: int, sizes: Iterable[int], limit: int | None,
                kernel: str = "kernel") -> Configuration:
    """The fastest configuration of `batch` samples from micro-batches in `sizes` whose every
    part fits `limit` bytes of workspace (None: unlimited)."""
    best_single: dict[int, MicroConfig] = {}
    for b in sorted(set(sizes)):
        m = table.fastest(b, limit) if b <= batch else None
        if m is not None:
            best_single[b] = MicroConfig(m.algo, b, m.time_ms, m.workspace)
    # T[b] = (time, last part, b - last part's size); larger parts first so ties keep fewer calls.
    candidates = sorted(best_single.values(), key=lambda m: -m.batch)
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
    if total[batch] is None:
        raise NoAlgorithmError(
            f"no algorithm of {kernel} runs within {limit} bytes of workspace at micro-batch sizes "
            f"{sorted(best_single) or 'any'} that sum to {batch}; raise the workspace limit or use "
            "a batch size policy with more sizes"
        )
    parts, b = [], batch
    while b:
        parts.append(last[b])
        b -= last[b].batch
    return Configuration(tuple(sorted(parts, key=lambda m: -m.batch)))
