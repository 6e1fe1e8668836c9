"""A stretch of work's time budget (`Slice`), and the one in force below the code that set it
(`within`, `current`): planning between iterations gives each stretch about PLANNING_SLICE_S, and
a benchmark deep below it ends its sweep between two rounds once the slice is spent (OutOfTime),
what it measured kept in the database, the next slice going on from there."""
from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator


class OutOfTime(Exception):
    """The slice in force was spent between two rounds of a sweep: what was measured is kept, the
    rest is measured in a later slice. Raised only inside `within`, caught by whoever set it."""


class Slice:
    """A stretch of work's time budget: spent once its deadline (time.perf_counter()) has passed
    and something was done in it (`worked`: a round measured, a kernel planned, a layer decided),
    so that every slice makes progress; a deadline of math.inf is never spent."""

    def __init__(self, deadline: float = math.inf):
        self.deadline, self.worked = deadline, False

    @classmethod
    def lasting(cls, seconds: float | None) -> Slice:
        """A slice of `seconds` from now (None: unbounded)."""
        return cls(math.inf if seconds is None else time.perf_counter() + seconds)

    def spent(self) -> bool:
        return self.worked and time.perf_counter() >= self.deadline


_CURRENT: contextvars.ContextVar[Slice | None] = contextvars.ContextVar("ucudnn_slice", default=None)


@contextlib.contextmanager
def within(budget: Slice) -> Iterator[Slice]:
    """Inside, `budget` is the slice in force (current()), for work below that can stop early."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def current() -> Slice | None:
    """The slice in force (within), or None: nothing below may stop early."""
    return _CURRENT.get()
