"""Staging: a micro-batch slice that does not start at a 256-byte boundary runs through an aligned copy.

Every measurement is taken on buffers that start where a fresh allocation does, at a multiple of
SLICE_ALIGNMENT bytes. Samples [s, s + b) of x start s * sample_bytes(x) bytes into x, so a
sample whose size is not a multiple of 256 bytes puts most slices off that boundary: a 3x227x227
fp16 sample is 309,174 bytes, and only every 128th sample starts aligned. Off it, a plan may run
far slower than measured (docs/results.md, "Micro-batches at any sample") or,
where it declares an alignment the slice lacks (the graph API's tensors), be wrong.

So dispatch never hands a plan a slice off the boundary. A part whose x or y slice starts off it
stages that slice in its workspace: an input slice is copied there first, an output slice is
written there and copied out after (copied in first too where the call reads the output it
blends with). A part's workspace is laid out [dispatch's buffers | staged x | staged y | the
plan's own workspace], each at a 256-byte boundary. The optimizers count the copies in the part:
their bytes in its workspace, their modelled time in its time (`copy_ms`), so they split where
the measured kernels plus the copies are fastest. The buffers are assumed to start on the
boundary, as allocations do; dispatch refuses, with the reason, buffers that do not.
"""
from __future__ import annotations

from dataclasses import dataclass

from .workspace import ALIGNMENT, align_up

SLICE_ALIGNMENT = ALIGNMENT
SLICED = ("x", "y")  # the operands a micro-batch slices along N (w is whole in every call)
# A device-to-device copy on an H100, replayed in a CUDA graph: a fixed cost per copy and bytes at
# the copy rate (docs/results.md, "Micro-batches at any sample").
COPY_FIXED_MS = 0.0014
COPY_BYTES_PER_MS = 1.45e9


def copy_ms(nbytes: int) -> float:
    """The modelled time of one device-to-device copy of `nbytes` bytes."""
    return COPY_FIXED_MS + nbytes / COPY_BYTES_PER_MS if nbytes else 0.0


def is_aligned(offset: int) -> bool:
    """Whether a slice `offset` bytes into a buffer starts where the buffer's measurements did."""
    return offset % SLICE_ALIGNMENT == 0


@dataclass(frozen=True)
class Slices:
    """How a kernel's micro-batches sit in its buffers: the bytes of one sample of x and of y
    (0: every slice starts aligned, as for measurement tables that stand alone)."""

    x: int = 0
    y: int = 0

    def staged(self, first_sample: int) -> tuple[str, ...]:
        """The operands whose slice starting at sample `first_sample` is staged."""
        return tuple(t for t in SLICED if not is_aligned(first_sample * getattr(self, t)))

    def bytes(self, tensor: str, batch: int) -> int:
        """Bytes of the staging buffer of `batch` samples of `tensor`, rounded to the alignment."""
        return align_up(batch * getattr(self, tensor))

    def extra(self, staged: tuple[str, ...], batch: int) -> tuple[float, int]:
        """(ms, bytes) that staging `staged` adds to a part of `batch` samples."""
        sizes = [self.bytes(t, batch) for t in staged]
        return sum(copy_ms(n) for n in sizes), sum(sizes)

    def classes(self, batch: int) -> list[tuple[str, ...]]:
        """The staged sets that occur at the starts of parts of a kernel of `batch` samples."""
        return sorted({self.staged(s) for s in range(batch)})


ALIGNED = Slices()


def slices_of(problem) -> Slices:
    """The slices of kernel `problem` (a ConvProblem)."""
    return Slices(problem.sample_bytes("x"), problem.sample_bytes("y"))
