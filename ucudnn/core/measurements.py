"""Measured time and workspace of candidates at micro-batch sizes: t(a, b) and ws(a, b).

A candidate `a` is named `backend:name` (ucudnn.execute.backends), e.g. 'legacy:FFT_TILING'."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .accumulation import accumulates
from .accuracy import accurate
from .errors import CudnnError
from .problem import ConvProblem

# Statuses of a measurement. Only OK ones are candidates for the optimizers.
OK = "ok"
UNSUPPORTED = "unsupported"  # cuDNN does not implement this algorithm for this kernel
FAILED = "failed"  # cuDNN returned an error when running it
OUT_OF_MEMORY = "out_of_memory"  # its workspace could not be allocated
OVER_CAP = "over_cap"  # workspace larger than the benchmark's cap: not timed
# ranked below the best few that a pruned search times (ucudnn.optimizers.search): not built, so its
# workspace is unknown (stored as 0); a full search measures it. Never replaces a row taken.
PRUNED = "pruned"
STATUSES = (OK, UNSUPPORTED, FAILED, OUT_OF_MEMORY, OVER_CAP, PRUNED)
UNMEASURED = (OVER_CAP, OUT_OF_MEMORY)  # not timed: measured again when a limit admits them
# What a candidate is (timed, or refused, or failing): a row of these is kept over a later one of
# circumstance (UNMEASURED) or PRUNED, and those replace each other, newest first, so that a
# candidate over one cap and pruned at a larger one reads as pruned there, not as unmeasured
TAKEN = (OK, UNSUPPORTED, FAILED)
# Rows of this backend are torch's own convolution, timed by ucudnn.torch to decide delegation
# ('torch:<torch version>'): kept beside the candidates' so that a later process decides alike
# without timing again, never a candidate of the optimizers, which read their backends' rows only.
TORCH = "torch"


def failure_status(exc: Exception) -> str:
    """The status of a candidate whose call raised `exc`: UNSUPPORTED where cuDNN refused the
    call's parameters, FAILED for any other error."""
    return UNSUPPORTED if isinstance(exc, CudnnError) and exc.refused else FAILED


@dataclass(frozen=True)
class Measurement:
    """Candidate `algo` on a micro-batch of `batch` samples: median time and workspace bytes;
    `accumulates`: timed as a part of a backward-filter sum, its buffers in the workspace
    (ucudnn.core.accumulation), which a whole call of `batch` samples is not."""

    algo: str
    batch: int
    time_ms: float | None
    workspace: int
    status: str = OK
    repeats: int = 0
    accumulates: bool = False

    @property
    def available(self) -> bool:
        return self.status == OK

    @property
    def available_ms(self) -> float:
        """time_ms of an available measurement: every one is timed (a database's rows too)."""
        assert self.time_ms is not None, f"{self.algo} at micro-batch {self.batch} is {self.status}, not timed"
        return self.time_ms


class KernelTable:
    """All measurements of one kernel, by micro-batch size."""

    def __init__(self, measurements: Iterable[Measurement] = ()) -> None:
        self._by_batch: dict[int, dict[str, Measurement]] = {}
        for m in measurements:
            self.add(m)

    def add(self, m: Measurement) -> None:
        self._by_batch.setdefault(m.batch, {})[m.algo] = m

    def __iter__(self):
        for per_algo in self._by_batch.values():
            yield from per_algo.values()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_batch.values())

    def only(self, backends: Iterable[str] | None) -> KernelTable:
        """The measurements of candidates of `backends` (None: all of them)."""
        if backends is None:
            return self
        prefixes = tuple(f"{b}:" for b in backends)
        return KernelTable(m for m in self if str(m.algo).startswith(prefixes))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._by_batch))

    def at(self, batch: int) -> list[Measurement]:
        return list(self._by_batch.get(batch, {}).values())

    def choices(self, batch: int, limit: int | None = None) -> list[Measurement]:
        """Available algorithms at `batch` whose workspace fits `limit` (None: any)."""
        return [m for m in self.at(batch) if m.available and (limit is None or m.workspace <= limit)]

    def fastest(self, batch: int, limit: int | None = None) -> Measurement | None:
        return min(self.choices(batch, limit), key=lambda m: (m.available_ms, m.workspace), default=None)

    def complete_for(self, batch: int, limit: int | None) -> bool:
        """Whether every algorithm that could fit `limit` at `batch` was measured, so the table can
        answer for that limit without benchmarking again. Out of memory is a circumstance, not a
        property of the candidate: such rows are measured again where they could fit, so a run
        under memory pressure never takes fast candidates away from later runs."""
        at = self.at(batch)
        return bool(at) and not any(
            m.status in UNMEASURED and (limit is None or m.workspace <= limit) for m in at
        )


class ShapeTable:
    """Every measurement of one shape key at any micro-batch size, whole calls and parts of sums
    apart: what a database holds, shared by the kernels of every batch size."""

    def __init__(self, measurements: Iterable[Measurement] = ()) -> None:
        self._rows: dict[tuple[int, bool, str], Measurement] = {}
        for m in measurements:
            self.add(m)

    def add(self, m: Measurement) -> None:
        """Keep `m`, replacing the row of its (batch, part of a sum, candidate), unless that row
        was TAKEN and `m` was not (the rule the database's upsert also keeps)."""
        key = (m.batch, m.accumulates, m.algo)
        if m.status in TAKEN or key not in self._rows or self._rows[key].status not in TAKEN:
            self._rows[key] = m

    def __iter__(self):
        return iter(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    def for_kernel(self, kernel: ConvProblem) -> KernelTable:
        """The table of `kernel`: at each micro-batch size, the measurements taken as the kernel
        runs it (ucudnn.core.accumulation): parts of sums below its batch; at its batch the whole call,
        or where a candidate was measured only as a part, the part, which overstates the whole
        call's workspace and time, never understates them. Rows of candidates not accurate
        enough for the kernel (ucudnn.core.accuracy) are left out."""
        rows: dict[tuple[int, str], Measurement] = {}
        for m in self:
            if not accurate(kernel, m.algo):
                continue
            if m.accumulates == accumulates(kernel, m.batch):
                rows[m.batch, m.algo] = m
            elif m.batch == kernel.batch:
                rows.setdefault((m.batch, m.algo), m)
        return KernelTable(rows.values())

    def summed(self, parts: bool) -> KernelTable:
        """The measurements of parts of sums (True) or of whole calls (False)."""
        return KernelTable(m for m in self if m.accumulates == parts)


def describe_sizes(sizes: Sequence[int], shown: int = 10) -> str:
    """'micro-batch sizes [1, 2, 4]', or for a long list its count, range and first few."""
    if len(sizes) <= shown:
        return f"micro-batch sizes {list(sizes)}"
    first = ", ".join(map(str, sizes[:shown]))
    return f"{len(sizes)} micro-batch sizes from {min(sizes)} to {max(sizes)} ({first}, ...)"
