"""Workspace division (paper III-C, step 3): one buffer for the whole network, one segment of it
per kernel, at the aligned prefix sum of the sizes before it."""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .errors import ConfigError

ALIGNMENT = 256  # bytes; cudaMalloc returns 256-byte aligned memory, so every segment start is too
Name = TypeVar("Name", bound=Hashable)  # what a segment belongs to: a kernel's name, a stream


@dataclass(frozen=True)
class Segment:
    """Bytes [offset, offset + size) of the network's workspace buffer."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def pointer(self, base: int) -> int:
        """The segment's address in a buffer that starts at address `base`."""
        return base + self.offset


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def divide(sizes: Mapping[Name, int], alignment: int = ALIGNMENT) -> tuple[dict[Name, Segment], int]:
    """One segment per name, in the mapping's order, each starting at a multiple of `alignment`,
    and the buffer size they need (the sum of the sizes, each rounded up to the alignment)."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ConfigError(f"alignment={alignment!r} must be a positive number of bytes")
    segments: dict[Name, Segment] = {}
    offset = 0
    for name, size in sizes.items():
        if size < 0:
            raise ConfigError(f"workspace size of {name!r} is {size} bytes; it cannot be negative")
        segments[name] = Segment(offset, size)
        offset += align_up(size, alignment)
    return segments, offset
