"""WR (workspace reuse, paper III-B): per kernel, dynamic programming over micro-batch sizes.

    T1(s, b) = min { t(a, b) + c(s, b) : a available, ws(a, b) + w(s, b) <= M }      for b in S
    R(B)     = 0
    R(s)     = min over b in S, s + b <= B, R(s + b) defined, of T1(s, b) + R(s + b)
    T(B)     = R(0)

A part of b samples that starts at sample s costs what its candidate was measured at, plus c(s, b)
and w(s, b): the time and bytes of staging its slices where they start off the alignment the
measurements had (ucudnn.core.staging; 0 where they start on it). The state is the sample a part starts
at, so its cost may depend on where it starts; parts run in the order R(0) takes them.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..core.errors import NoAlgorithmError
from ..core.measurements import KernelTable
from ..core.staging import ALIGNED, Slices
from .configuration import Configuration, MicroConfig


class Parts:
    """T1: the fastest micro-configuration of `b` samples for each staged set, within the limit,
    its staging counted in its time and workspace; None where none fits."""

    def __init__(self, table: KernelTable, limit: int | None, slices: Slices):
        self.table, self.limit, self.slices = table, limit, slices
        self._best: dict[tuple[tuple[str, ...], int], MicroConfig | None] = {}

    def of(self, staged: tuple[str, ...], batch: int) -> MicroConfig | None:
        """The part of `batch` samples whose slices `staged` (Slices.staged of its first sample) are staged."""
        if (staged, batch) not in self._best:
            self._best[staged, batch] = self._fastest(staged, batch)
        return self._best[staged, batch]

    def _fastest(self, staged: tuple[str, ...], batch: int) -> MicroConfig | None:
        ms, extra = self.slices.extra(staged, batch)
        room = None if self.limit is None else self.limit - extra
        m = None if room is not None and room < 0 else self.table.fastest(batch, room)
        return None if m is None else MicroConfig(m.algo, batch, m.available_ms + ms, m.workspace + extra)


def optimize_wr(table: KernelTable, batch: int, sizes: Iterable[int], limit: int | None,
                kernel: str = "kernel", slices: Slices = ALIGNED) -> Configuration:
    """The fastest configuration of `batch` samples from micro-batches in `sizes` whose every
    part, staging included, fits `limit` bytes of workspace (None: unlimited). `slices`: the
    kernel's sample sizes, which say where a part's slices need staging (default: nowhere).
    Parts run in the returned order."""
    usable = sorted({b for b in sizes if 1 <= b <= batch}, reverse=True)  # larger first: ties keep fewer calls
    parts = Parts(table, limit, slices)
    rest: list[float | None] = [None] * batch + [0.0]  # rest[s]: the fastest way to run samples s..batch
    first: list[MicroConfig | None] = [None] * (batch + 1)
    for start in range(batch - 1, -1, -1):
        staged = slices.staged(start)
        for b in usable:
            after = rest[start + b] if start + b <= batch else None
            if after is None:
                continue
            part, best = parts.of(staged, b), rest[start]
            if part is not None and (best is None or after + part.time_ms < best):
                rest[start], first[start] = after + part.time_ms, part
    if rest[0] is None:
        raise NoAlgorithmError(
            f"no algorithm of {kernel} runs within {limit} bytes of workspace at micro-batch sizes "
            f"{sorted(usable) or 'any'} that sum to {batch}; raise the workspace limit or use "
            "a batch size policy with more sizes"
        )
    found: list[MicroConfig] = []
    start = 0
    while start < batch:
        part = first[start]
        assert part is not None  # rest[start] is defined wherever R(0)'s parts start
        found.append(part)
        start += part.batch
    if slices.classes(batch) == [()]:  # no part is staged wherever it starts: larger parts first
        found.sort(key=lambda m: -m.batch)
    return Configuration(tuple(found))
