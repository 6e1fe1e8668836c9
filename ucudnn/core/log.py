"""The `ucudnn` logger: what the library says as it works (the progress line of long planning,
each plan with the verbose setting), at level INFO.

As a library's logger, it has a NullHandler and nothing else: its records reach the handlers the
application configures (`logging.basicConfig(level=logging.INFO)`, or one of its own), and nowhere
else. The `ucudnn` command writes them on stderr as "ucudnn: ..." lines, from rank 0 only; a
script gets the same with `ucudnn.log_to_stderr()`.

Under torch.distributed that handler writes nothing in a process whose rank (ucudnn.core.ranks:
the process group's, else the RANK variable that torchrun and torch.distributed's launchers set)
is other than 0; `is_rank_zero` is that filter, for a handler of your own.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Protocol, TextIO

from .errors import ConfigError
from .ranks import current_rank


class Planned(Protocol):
    """What say_plan reads of a plan (an optimizers.configuration.Configuration)."""

    @property
    def time_ms(self) -> float: ...

    def describe(self) -> str: ...


LOGGER = logging.getLogger("ucudnn")
LOGGER.addHandler(logging.NullHandler())
REDRAWN = "ucudnn_redrawn"  # a record's attribute (logging's `extra`): on a terminal, the next line replaces it


def is_rank_zero(record: logging.LogRecord | None = None) -> bool:
    """Whether this process is its job's rank 0 (ucudnn.core.ranks), or in no job; a rank the
    environment misstates counts as 0 here (the library's other reads of it raise). Also a
    logging filter: a handler given it writes rank 0's records only."""
    try:
        return current_rank().rank == 0
    except ConfigError:
        return True


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class StderrHandler(logging.Handler):
    """Each record of rank 0 on a line of sys.stderr (looked up per record: pytest and notebooks
    replace it). On a terminal a record marked REDRAWN is left open, and the next record replaces
    it: a progress line updates in place, and a line said meanwhile stays above the next update."""

    def __init__(self) -> None:
        super().__init__()
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


STDERR = StderrHandler()  # the one handler log_to_stderr adds, however often it is called


def log_to_stderr(level: int = logging.INFO) -> logging.Handler:
    """For scripts: the `ucudnn` logger's records of `level` and above as "ucudnn: ..." lines on
    stderr, from rank 0 only, as the `ucudnn` command writes them. Returns the handler:
    `logging.getLogger("ucudnn").removeHandler(handler)` undoes it. The records still reach the
    root logger's handlers too (where the script configured some, they write them as well)."""
    LOGGER.setLevel(level)
    if STDERR not in LOGGER.handlers:
        LOGGER.addHandler(STDERR)
    return STDERR


@contextlib.contextmanager
def logging_to_stderr(level: int = logging.INFO) -> Iterator[logging.Handler]:
    """log_to_stderr while the block runs (a command of the CLI), the logger as it was after it."""
    level_before, added = LOGGER.level, STDERR not in LOGGER.handlers
    try:
        yield log_to_stderr(level)
    finally:
        LOGGER.setLevel(level_before)
        if added:
            LOGGER.removeHandler(STDERR)


def redraws() -> bool:
    """Whether a REDRAWN line replaces itself: STDERR writes the logger's lines, to a terminal."""
    return STDERR in LOGGER.handlers and _is_terminal(sys.stderr)


def say(message: str, *, redrawn: bool = False) -> None:
    """`message` at INFO; `redrawn`: the next line replaces it on a terminal (a progress line)."""
    LOGGER.info(message, extra={REDRAWN: redrawn})


def say_plan(what: str, configuration: Planned, workspace: int) -> None:
    """The line of the verbose setting: kernel `what` is planned as `configuration`, in `workspace` bytes."""
    say(f"{what}: {configuration.describe()}, {workspace / 2**20:.1f} MiB of workspace, "
        f"{configuration.time_ms:.3f} ms predicted")
