"""One line while planning takes long, said through the `ucudnn` logger (ucudnn.core.log): what is
planned so far, the seconds, what is being timed. Quiet for the first AFTER_S seconds of a
stretch of planning (most plans come from a database in milliseconds); on a terminal the line
updates in place, elsewhere (a log file) it is written again at most every LOG_EVERY_S seconds.
A stretch ends, with a closing line, at the first call that needs no planning once IDLE_S have
passed since the last planning step (idle), or where its caller's work is done (close: a command's
end).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .log import redraws, say

AFTER_S = 2.0  # planning shorter than this shows nothing
IDLE_S = 0.5  # no planning for this long, and a call that needs none: the stretch is over
LOG_EVERY_S = 5.0  # not a terminal: at most one line this often
TTY_EVERY_S = 0.1  # a terminal: the line is redrawn at most this often


def counted(n: int, noun: str) -> str:
    """'1 figure', '8 figures': a count as the line says it."""
    return f"{n} {noun}{'s' * (n != 1)}"


class Progress:
    """Shows planning as it goes (see the module's docstring); `enabled` False shows nothing."""

    def __init__(self, enabled: bool = True, clock: Callable[[], float] = time.monotonic):
        self.enabled, self.clock = enabled, clock
        self._started: float | None = None  # this stretch's start
        self._last_step = self._last_shown = 0.0
        self._shown = False
        self.open = False  # whether a stretch of planning is going on (a plain flag: calls check it)

    def step(self, doing: str, status: str) -> None:
        """A planning step begins: `doing` (what is timed), `status` (what is done so far)."""
        now = self.clock()
        if self._started is None:
            self._started, self._shown, self.open = now, False, True
        self._last_step = now
        elapsed = now - self._started
        if not self.enabled or elapsed < AFTER_S:
            return
        if now - self._last_shown < (TTY_EVERY_S if redraws() else LOG_EVERY_S) and self._shown:
            return
        say(f"planning, {elapsed:.0f} s: {status}; {doing}", redrawn=True)
        self._last_shown, self._shown = now, True

    def finished(self) -> None:
        """A planning step ended."""
        self._last_step = self.clock()

    def idle(self, summary: Callable[[], str]) -> None:
        """A call needed no planning: after IDLE_S without any, the stretch ends, with
        `summary()` on its own line where the stretch was shown."""
        if self._started is not None and self.clock() - self._last_step >= IDLE_S:
            self.close(summary)

    def close(self, summary: Callable[[], str]) -> None:
        """The stretch ends now, with `summary()` on its own line where it was shown."""
        if self._shown and self._started is not None:  # shown: started
            say(f"planned in {self._last_step - self._started:.1f} s: {summary()}")
        self._started, self._shown, self.open = None, False, False
