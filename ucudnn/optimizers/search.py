"""How much of a kernel's candidate space a benchmark times: a pruned search, or a full one.

- `pruned` (the default): at each micro-batch size, per backend, the first BEST candidates in
  cuDNN's heuristic order (ucudnn.execute.backends: `ranked`) are measured: timed where their workspace
  fits the cap, else recorded over it; where none of them runs, the ranking is followed on to the
  first that does; the rest are PRUNED (not even built), and so are, below a size measured, the
  candidates that ran there more than DOMINATED times slower than one needing no more workspace
  (assumed: relative speeds change little from one micro-batch size to the next; not yet
  measured against a full search). Sizes are taken largest first, down to the first where the cap no
  longer keeps a candidate out, or that pays nothing: it runs no faster per sample than the sizes
  above it and no candidate over the cap there needs less workspace there than a size above (so
  none is getting closer to fitting); where the cap keeps nothing out at the whole batch, the
  whole batch alone. WD measures every size of the policy (`named(..., walk=False)`): its cap,
  the network's total, says nothing of one kernel's share. torch's benchmark mode times at most 10
  heuristic plans a convolution; the engines backend lists several times as many a micro-batch, and
  building them all is most of a cold start (docs/results.md, "Cold start").
- `full`: every candidate of every backend at every size of the policy, PRUNED rows measured
  again: what `ucudnn bench` records for a shipped or shared database.

A search decides from the table what is left to measure, so a second process on the same
database asks for nothing more. Every full table is complete for the pruned search.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..core.errors import unknown
from ..core.measurements import PRUNED, KernelTable

BEST = 10  # candidates measured per backend and micro-batch size by the pruned search
DOMINATED = 4.0  # ... and below a size, none that ran this many times slower there than one with no more workspace


@dataclass(frozen=True)
class Search:
    """`best`: candidates measured per backend and size, the first of the ranking (None: all);
    `walk`: sizes largest first, stopping where a smaller one stops paying (else every size)."""

    name: str
    best: int | None
    walk: bool
    dominated: float | None = None  # see DOMINATED (None: every candidate at every size)

    def complete_at(self, table: KernelTable, batch: int, cap: int | None,
                    backends: Sequence[str] | None = None) -> bool:
        """Whether `table` answers for `batch` samples within `cap` as this search measures, for
        each of `backends` (None: the table as a whole)."""
        return all(self._complete(table.only([b]), batch, cap) for b in backends) if backends \
            else self._complete(table, batch, cap)

    def _complete(self, table: KernelTable, batch: int, cap: int | None) -> bool:
        done = table.complete_for(batch, cap)
        return done if self.best is not None else done and not any(m.status == PRUNED for m in table.at(batch))

    def sizes(self, table: KernelTable, sizes: Iterable[int], cap: int | None,
              backends: Sequence[str] | None = None) -> list[int]:
        """The micro-batch sizes this search needs measured, as far as `table` tells: every size
        (full), or the walk down from the largest, which ends at the first size the table cannot
        answer yet (measure it, then ask again) or at the first that does not pay."""
        if not self.walk:
            return sorted(set(sizes))
        ordered = sorted(set(sizes), reverse=True)
        needed, best_rate, above = [], math.inf, None
        for batch in ordered:
            needed.append(batch)
            if not self.complete_at(table, batch, cap, backends) or not _binds(table, batch, cap):
                break
            fastest = table.fastest(batch, cap)
            rate = fastest.available_ms / batch if fastest else math.inf
            if above is not None and rate >= best_rate and not _shrinking(table, batch, above, cap):
                break
            best_rate, above = min(best_rate, rate), batch
        return needed

    def skipped(self, table: KernelTable, batch: int) -> frozenset[str]:
        """The candidates not to measure at `batch`: those that, at the nearest larger size they
        ran at, ran more than `dominated` times slower than one with no more workspace there."""
        if self.dominated is None:
            return frozenset()
        dominated: dict[str, bool] = {}
        for b in sorted(s for s in table.sizes if s > batch):  # nearest first: its verdict stands
            best = math.inf
            for m in sorted(table.choices(b), key=lambda m: (m.workspace, m.available_ms)):
                dominated.setdefault(m.algo, m.available_ms > self.dominated * best)
                best = min(best, m.available_ms)
        return frozenset(algo for algo, slower in dominated.items() if slower)

    def missing(self, table: KernelTable, sizes: Iterable[int], cap: int | None,
                backends: Sequence[str] | None = None) -> list[int]:
        """The sizes this search needs that `table` cannot answer yet (for each of `backends`)."""
        return [b for b in self.sizes(table, sizes, cap, backends) if not self.complete_at(table, b, cap, backends)]


def _binds(table: KernelTable, batch: int, cap: int | None) -> bool:
    """Whether the cap kept a candidate out at `batch`: one of those ranked before the last timed
    was over it (or out of memory), so a smaller micro-batch may let it in."""
    return cap is not None and any(m.workspace > cap for m in table.at(batch) if m.status != PRUNED)


def _shrinking(table: KernelTable, batch: int, above: int, cap: int | None) -> bool:
    """Whether a candidate over the cap at `batch` needs less workspace there than at `above`."""
    before = {m.algo: m.workspace for m in table.at(above) if m.status != PRUNED}
    return cap is not None and any(m.workspace > cap and m.workspace < before.get(m.algo, 0)
                                   for m in table.at(batch) if m.status != PRUNED)


SEARCHES = {"pruned": Search("pruned", BEST, walk=True, dominated=DOMINATED), "full": Search("full", None, walk=False)}
PRUNED_SEARCH, FULL = SEARCHES["pruned"], SEARCHES["full"]


def named(name: str, *, walk: bool = True) -> Search:
    """The search a `search` setting names; `walk` False measures every size of the policy: WD
    divides one total among the kernels, and that total, the cap it measures within, keeps
    nothing out of any one kernel, which would end the walk at the whole batch."""
    if name not in SEARCHES:
        raise unknown(name, tuple(SEARCHES), "search")
    return SEARCHES[name] if walk else replace(SEARCHES[name], walk=False)
