"""The `ucudnn` logger: what the library says as it works (the progress line of long planning,
each plan with the verbose setting), as "ucudnn: ..." lines on stderr at level INFO.

Under torch.distributed only rank 0 says it: a process whose rank (ucudnn.core.ranks: the process
group's, else the RANK variable that torchrun and torch.distributed's launchers set) is other than 0
writes nothing. Change either through the
logging module: `logging.getLogger("ucudnn").setLevel(logging.WARNING)` silences the library;
removing HANDLER from it (and setting its `propagate` back on) sends its records, from every
rank, to your own handlers instead.
"""
from __future__ import annotations

import logging
import sys
from typing import Protocol, TextIO

from .errors import ConfigError
from .ranks import current_rank



class Planned(Protocol):
    """What say_plan reads of a plan (an optimizers.configuration.Configuration)."""

    time_ms: float

    def describe(self) -> str: ...


LOGGER = logging.getLogger("ucudnn")
REDRAWN = "ucudnn_redrawn"  # a record's attribute (logging's `extra`): on a terminal, the next line replaces it


def is_rank_zero(record: logging.LogRecord | None = None) -> bool:
    """Whether this process is its job's rank 0 (ucudnn.core.ranks), or in no job; a rank the
    environment misstates counts as 0 here (the library's other reads of it raise)."""
    try:
        return current_rank().rank == 0
    except ConfigError:
        return True


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StderrHandler(logging.Handler):
    """Each record on a line of sys.stderr (looked up per record: pytest and notebooks replace it).
    On a terminal a record marked REDRAWN is left open, and the next record replaces it: a
    progress line updates in place, and a line said meanwhile stays above the next update."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.addFilter(is_rank_zero)
        self.setFormatter(logging.Formatter("ucudnn: %(message)s"))
        self._open = False  # a redrawn line is on the terminal, unended

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream, line = sys.stderr, self.format(record)
            if _is_terminal(stream):
                redrawn = bool(getattr(record, REDRAWN, False))
                stream.write(("\r\x1b[2K" if self._open else "") + line + ("" if redrawn else "\n"))
                self._open = redrawn
            else:
                stream.write(line + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's rule: a handler reports its failure, never raises
            self.handleError(record)


HANDLER = StderrHandler()
LOGGER.addHandler(HANDLER)
LOGGER.setLevel(logging.INFO)
LOGGER.propagate = False  # while HANDLER writes the records, the root's handlers would write them twice


def redraws() -> bool:
    """Whether a REDRAWN line replaces itself: HANDLER writes the logger's lines, to a terminal."""
    return HANDLER in LOGGER.handlers and _is_terminal(sys.stderr)


def say(message: str, *, redrawn: bool = False) -> None:
    """`message` at INFO; `redrawn`: the next line replaces it on a terminal (a progress line)."""
    LOGGER.info(message, extra={REDRAWN: redrawn})


def say_plan(what: str, configuration: Planned, workspace: int) -> None:
    """The line of the verbose setting: kernel `what` is planned as `configuration`, in `workspace` bytes."""
    say(f"{what}: {configuration.describe()}, {workspace / 2**20:.1f} MiB of workspace, "
        f"{configuration.time_ms:.3f} ms predicted")
