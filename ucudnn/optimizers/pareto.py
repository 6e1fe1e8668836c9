"""Desirable configurations (paper III-C1): the Pareto front in (time, workspace) of every
configuration of a kernel, by WR's recursion keeping sets instead of minima.

    D(0) = { [] }
    D(b) = P( union over b' in S, b' <= b, of { c ++ [(a, b')] : c in D(b - b'), a available at b' } )

P keeps the points no other point beats in both time and workspace (of exact ties, one).
As in WR (wr.py), a part's time and workspace include staging its slices where it starts off the
alignment the measurements had (ucudnn.core.staging): the part appended to D(b - b') starts at b - b'.
The recursion runs for many kernels at once, vectorized over kernels and candidates: a network's
kernels then cost one pass over b instead of one per kernel.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from ..core.measurements import PRUNED, UNMEASURED, KernelTable, Measurement
from ..core.staging import ALIGNED, SLICED, Slices
from .configuration import Configuration, MicroConfig

Kernel = tuple[KernelTable, int, Iterable[int]]  # measurements, mini-batch size, micro-batch sizes


def pareto_order(time: ArrayLike, workspace: ArrayLike) -> np.ndarray:
    """Indices of the Pareto front of the points (time[i], workspace[i]), by workspace ascending
    (so time descending); of points with equal coordinates, the first."""
    times = np.asarray(time, dtype=float)
    one = np.zeros(len(times), dtype=np.int64)
    rank, ranks = _ranks(one, np.asarray(workspace, dtype=np.int64))
    return _front(times, one, rank, (1, ranks))


def plannable(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Of one kernel's measurements at one micro-batch size from one backend, those planning can
    use: the available ones on the time-workspace front (WR picks the fastest that fits, WD's
    desirable sets start from the front: a dominated candidate is never chosen), every row not
    timed (over the cap or out of memory: a later run would time it; KernelTable.complete_for
    reads them; PRUNED: a full search measures them, ucudnn.optimizers.search), and, where nothing of
    those is left, one row that says the size was measured. What a shipped or shared file can
    keep without changing any plan or what a search asks for."""
    ok = sorted((m for m in measurements if m.available), key=lambda m: m.algo)  # ties: the first name
    front = [ok[i] for i in pareto_order([m.available_ms for m in ok], [m.workspace for m in ok])] if ok else []
    kept = front + [m for m in measurements if m.status in (*UNMEASURED, PRUNED)]
    return kept or sorted(measurements, key=lambda m: m.algo)[:1]


def _ranks(group: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense rank of each value among its group's values, from 1 (0 is left for the empty
    configuration), and a bound on the ranks."""
    distinct, value = np.unique(values, return_inverse=True)
    keys, index = np.unique(group * len(distinct) + value.reshape(-1), return_inverse=True)
    key_group = keys // max(len(distinct), 1)
    rank = index.reshape(-1) - np.searchsorted(key_group, group) + 1
    return rank, 1 + int(np.bincount(key_group, minlength=1).max())


def _front(time: np.ndarray, group: np.ndarray, rank: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The Pareto front of each group's points (groups in range(shape[0]), workspace ranks in
    range(shape[1])): indices by (group, rank) ascending. A group minimum, not a sort: the DP
    calls this on millions of candidates."""
    cell = group * shape[1] + rank
    best = np.full(shape, np.inf)
    np.minimum.at(best.reshape(-1), cell, time)
    on_front = np.empty(shape, dtype=bool)
    on_front[:, 0] = best[:, 0] < np.inf
    on_front[:, 1:] = best[:, 1:] < np.minimum.accumulate(best, axis=1)[:, :-1]
    hits = np.flatnonzero(time == best.reshape(-1)[cell])
    first = np.full(best.size, len(time))
    np.minimum.at(first, cell[hits], hits)
    return first[on_front.reshape(-1)]


def _start_classes(slices: Sequence[Slices], batches: np.ndarray) -> np.ndarray:
    """[kernel, s]: the staged set (_number) of a part of the kernel that starts at sample s."""
    found = np.zeros((len(batches), batches.max() + 1), dtype=np.int64)
    for k, (kernel_slices, batch) in enumerate(zip(slices, batches)):
        found[k, :batch] = [_number(kernel_slices.staged(s)) for s in range(batch)]
    return found


def _number(staged: tuple[str, ...]) -> int:
    """A staged set as a number: bit i set where SLICED[i] is staged."""
    return sum(1 << i for i, t in enumerate(SLICED) if t in staged)


class _Micros:
    """The micro-configurations worth using of every kernel, as arrays by micro-batch size
    ascending: per kernel, size and staged set, the Pareto front of the available algorithms that
    fit the limit with their staging (one beaten at its own size and start is beaten in every
    configuration too). Workspaces are ranks among the kernel's own micros' workspaces: max
    commutes with ranking."""

    def __init__(self, kernels: Sequence[Kernel], limit: int | None, slices: Sequence[Slices]):
        rows = [(k, _number(staged), m.algo, b, m.available_ms + ms, m.workspace + extra)
                for k, (table, batch, sizes) in enumerate(kernels)
                for staged in slices[k].classes(batch)
                for b in sorted({s for s in sizes if 1 <= s <= batch})
                for ms, extra in [slices[k].extra(staged, b)]
                if limit is None or extra <= limit
                for m in sorted(table.choices(b, None if limit is None else limit - extra), key=lambda m: m.algo)]
        kernel, cls, batch, workspace = (np.array([r[i] for r in rows], dtype=np.int64) for i in (0, 1, 3, 5))
        time = np.array([r[4] for r in rows], dtype=float)
        span = 1 + max(batch, default=0)
        cells, cell = np.unique((kernel * 4 + cls) * span + batch, return_inverse=True)
        rank, ranks = _ranks(cell, workspace)
        keep = _front(time, cell.reshape(-1), rank, (len(cells), ranks))
        keep = keep[np.argsort(batch[keep], kind="stable")]
        self.configs = [MicroConfig(*rows[i][2:]) for i in keep]
        self.kernel, self.batch, self.time, self.cls = kernel[keep], batch[keep], time[keep], cls[keep]
        self.rank, self.ranks = _ranks(self.kernel, workspace[keep])


class _Store:
    """Every D(b) of every kernel in flat growable columns, appended b by b, kernel by kernel.
    A row is one configuration: its kernel, time, workspace rank, parent row (the configuration it
    extends, -1 for []) and the micro-configuration it appends.
    key = (b * kernels + kernel) * ranks + rank sorts all rows, so one searchsorted looks into
    many D(b) at once."""

    def __init__(self, batches: np.ndarray, ranks: int):
        self.shape = (len(batches), ranks)
        self.start = np.zeros((len(batches), batches.max() + 1), dtype=np.int64)
        self.count = np.zeros_like(self.start)
        self.size = 0
        self.columns = {name: np.zeros(64, dtype=float if name == "time" else np.int64)
                        for name in ("kernel", "time", "rank", "parent", "micro", "key")}
        everyone = np.arange(len(batches))
        self.put(0, kernel=everyone, time=np.zeros(len(batches)), rank=np.zeros_like(everyone),
                 parent=np.full_like(everyone, -1), micro=np.full_like(everyone, -1))

    def __getattr__(self, column: str) -> np.ndarray:
        """store.time, store.parent, ...: the filled part of a column."""
        return self.__dict__["columns"][column][:self.size]

    def key_of(self, b, kernel, rank):
        return (b * self.shape[0] + kernel) * self.shape[1] + rank

    def put(self, b: int, **rows: np.ndarray) -> None:
        """Append D(b) of every kernel; rows sorted by kernel."""
        end = self.size + len(rows["time"])
        rows["key"] = self.key_of(b, rows["kernel"], rows["rank"])
        for name, column in self.columns.items():
            if end > len(column):
                column = self.columns[name] = np.resize(column, max(end, 2 * len(column)))
            column[self.size:end] = rows[name]
        kernels = np.arange(self.shape[0])
        self.start[:, b] = self.size + np.searchsorted(rows["kernel"], kernels)
        self.count[:, b] = np.bincount(rows["kernel"], minlength=self.shape[0])
        self.size = end

    def rows(self, kernel: int, b: int) -> range:
        return range(self.start[kernel, b], self.start[kernel, b] + self.count[kernel, b])


def _candidates(store: _Store, micros: _Micros, b: int, batches: np.ndarray,
                start_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent row, micro index) of the configurations of b samples worth comparing: each micro
    appended to each configuration of the rest. Of the rest's configurations whose workspace does
    not exceed the micro's, all end up with the micro's workspace: only the fastest (the last)
    is kept. A micro joins only where it starts with its staged set (`start_class`, _start_classes)."""
    fits = (micros.batch <= b) & (b <= batches[micros.kernel])
    fits[fits] = micros.cls[fits] == start_class[micros.kernel[fits], b - micros.batch[fits]]
    idx = np.flatnonzero(fits)
    kernel, rest = micros.kernel[idx], b - micros.batch[idx]
    start = store.start[kernel, rest]
    end = start + store.count[kernel, rest]
    fits = np.searchsorted(store.key, store.key_of(rest, kernel, micros.rank[idx]), side="right")
    first = np.maximum(fits - 1, start)
    n = end - first
    parent = np.repeat(first - (np.cumsum(n) - n), n) + np.arange(n.sum())
    return parent, np.repeat(idx, n)


def desirable_sets(kernels: Sequence[Kernel], limit: int | None,
                   slices: Sequence[Slices] | None = None) -> list[list[Configuration]]:
    """desirable_set of every (table, batch, sizes), all under one `limit`, computed together;
    `slices`: each kernel's (ucudnn.core.staging; default: no part is staged)."""
    if not kernels:
        return []
    slices = [ALIGNED] * len(kernels) if slices is None else list(slices)
    micros = _Micros(kernels, limit, slices)
    batches = np.array([batch for _, batch, _ in kernels], dtype=np.int64)
    start_class = _start_classes(slices, batches)
    store = _Store(batches, micros.ranks)
    for b in range(1, batches.max() + 1):
        parent, micro = _candidates(store, micros, b, batches, start_class)
        kernel = micros.kernel[micro]
        time = store.time[parent] + micros.time[micro]
        rank = np.maximum(store.rank[parent], micros.rank[micro])
        keep = _front(time, kernel, rank, store.shape)
        store.put(b, kernel=kernel[keep], time=time[keep], rank=rank[keep], parent=parent[keep],
                  micro=micro[keep])
    return [[_configuration(store, row, micros.configs) for row in store.rows(k, batch)]
            for k, batch in enumerate(batches)]


def desirable_set(table: KernelTable, batch: int, sizes: Iterable[int],
                  limit: int | None, slices: Slices = ALIGNED) -> list[Configuration]:
    """The desirable configurations of `batch` samples from micro-batches in `sizes` whose
    workspace, staging included, fits `limit` bytes (None: any), by workspace ascending and time
    descending. WR's answer at any limit L <= `limit` is the fastest of them with workspace <= L."""
    return desirable_sets([(table, batch, sizes)], limit, [slices])[0]


def _configuration(store: _Store, row: int, micros: list[MicroConfig]) -> Configuration:
    """The configuration of a row, in dispatch order (each part starts where the one before ends)."""
    parts = []
    while store.parent[row] >= 0:
        parts.append(micros[store.micro[row]])
        row = store.parent[row]
    return Configuration(tuple(reversed(parts)))
