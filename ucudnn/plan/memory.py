"""Workspace limits from the memory timeline (workspace_limit="auto", ucudnn.torch's default).

In a training step the memory free changes tens of times over as activations are made and
freed: gigabytes at a model's first forward convolution, a hundred MiB or so at its last one's
backward (docs/results.md, "Whole models where memory is short"). A fixed per-kernel limit throws away gigabytes where the heaviest kernels run
and is still more than is free at the peak. So a layer first runs the framework's own
convolution for RECORDED_CALLS calls while the bytes free as each of its kernels starts are
recorded (its `room`: the least seen, less what the kernel itself writes), and each kernel is
then planned within what its moment leaves:

    limit = quantized(room - MARGIN_BYTES - room / MARGIN_DIVISOR)

A room observed before planning is lessened, as the layer's planning begins, by what the process
came to hold outside the framework's pool since (cuDNN's handle and the code of the kernels
planning timed: Moments.lessen). The margin covers what the converted call allocates around the
kernel that the framework's did not, the allocator's rounding and blocks it cannot merge; a
workspace that still cannot be had is planned again within less (ucudnn.plan.kernels.Kernels.shrink).
A workspace that can be had only by the framework's allocator giving all its cached blocks back
to the device (a flush: a device sync, then pages mapped again; docs/results-archive.md,
"Flushes") costs more than a smaller plan, up to
FLUSH_MS: once planning is done, the planned kernels are watched (Pool.flushes) in the first
step and in each step after one that flushed, over the next WATCHED_STEPS steps (FlushWatch); one
that flushed is planned within half its workspace as the next step starts, unless that plan is
predicted to be slower by more than a flush costs. Each plan that changes moves the cached blocks
the next step finds: a kernel that did not flush in one step can in a later one
(docs/results-archive.md, "The flush watch by step"); the step settles once no plan changes
(docs/results.md, "Forty steps"). A room observed as one number cannot say in which cached blocks
its bytes lie. quantized() rounds down to a grid of eight steps per power of two, so that kernels
at nearby moments share one plan.

WD's division at such moments: with a step's kernels running one after another, each moment
holds one kernel, so a division constrained moment by moment gives each kernel its moment's
room, which is WR's plan at that limit. total_limit="auto" therefore plans as the timeline
does (docs/torch.md); a persistent buffer divided among every kernel would take its bytes from
the step's peak for the whole step.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

AUTO = "auto"  # the workspace_limit (or total_limit) that asks for limits from the timeline
# Calls of a layer observed before it is planned: the first step has no optimizer state yet, and
# in the second the pool grows to the step's peak (its state made), taking memory from the device
# inside the windows it crosses; the third is the first whose windows time the step as it stays
# (docs/results.md, "Three observed calls").
RECORDED_CALLS = 3
MARGIN_BYTES = 16 * 2**20
MARGIN_DIVISOR = 16
WATCHED_STEPS = 16  # steps after planning in which kernels are watched for flushes (FlushWatch)
# What a flush costs a step: the least measured (docs/results-archive.md, "Flushes")
FLUSH_MS = 3.9
_STEPS = 8  # grid steps per power of two
# The share of the step's least room that CUDA graphs may hold (graph_budget): graphs accumulated
# beyond the room run a step out of memory (docs/results.md, "Training wherever the tensors fit")
GRAPH_SHARE = 4


class FlushWatch:
    """Which steps' kernel runs are watched for flushes (Planner.run, Flushes): of the first WATCHED_STEPS
    steps after planning, the first and each one after a step that flushed; the step after them
    closes the watch. Reading the framework's count costs tens of microseconds, so the rest go
    unwatched; kernels whose smaller plan would cost more than a flush are `kept` out of it."""

    def __init__(self) -> None:
        self.open = False  # whether the current step's runs are watched
        self.steps = self.watched = 0  # steps started since planning (up to WATCHED_STEPS + 1), steps watched
        self.kept: set = set()  # (site, kind, kernel) watched no more
        self._flushes: int | None = None  # the framework's count as the last step started

    @property
    def spent(self) -> bool:
        """Whether the watch is closed: the step after the last one it follows has started."""
        return self.steps > WATCHED_STEPS

    def step(self, flushes: Callable[[], int]) -> None:
        """A step starts; `flushes()` reads the framework's count of flushes (not once spent)."""
        if self.spent:
            return
        self.steps += 1
        if self.spent:
            self.open = False
            return
        count = flushes()
        self.open = self._flushes is None or count > self._flushes
        self._flushes = count
        self.watched += self.open


class Memory(NamedTuple):
    """One device's memory at one moment, in bytes."""

    free: int  # free on the device (cudaMemGetInfo): nobody holds it
    allocated: int  # held by the framework's tensors


def quantized(nbytes: int) -> int:
    """`nbytes` rounded down to the grid: whole MiB below 8 MiB, eight steps per power of two above."""
    mib = 2**20
    if nbytes < _STEPS * mib:
        return max(0, nbytes // mib * mib)
    step = 1 << (nbytes.bit_length() - 1 - 3)  # an eighth of the power of two below nbytes
    return nbytes // step * step


def graph_budget(rooms: list[int]) -> int:
    """What CUDA graphs may hold beside the framework's pool once a step's kernels are planned
    within `rooms` (their moments' free bytes): a graph holds its bytes for the whole step, so
    they come out of the least room, of which GRAPH_SHARE at most, less the margin; the kernel
    whose workspace then cannot be had is planned within less (Kernels.shrink). Graphs hold
    nothing where no room is known."""
    if not rooms:
        return 0
    return max(0, min(rooms) - MARGIN_BYTES) // GRAPH_SHARE


def workspace_limit(room: int) -> int:
    """The workspace limit of a kernel whose moment leaves `room` bytes free (its own output
    already taken): the room less the margin, on the grid."""
    return quantized(max(0, room - MARGIN_BYTES - room // MARGIN_DIVISOR))
