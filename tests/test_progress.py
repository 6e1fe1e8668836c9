"""The progress line of long planning (ucudnn.core.progress), on a fake clock, as the `ucudnn` logger
writes it on stderr where the CLI (or ucudnn.log_to_stderr) puts it there (ucudnn.core.log)."""
from __future__ import annotations

import io
import sys

import pytest

from ucudnn.core.log import LOGGER
from ucudnn.core.progress import AFTER_S, IDLE_S, LOG_EVERY_S, Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def stderr(monkeypatch, ucudnn_stderr):
    """Points stderr, where the logger writes, at a stream (a log file, or a Terminal); in the test,
    as pytest points it at its capture between a fixture's setup and the test."""
    def pointed(stream: io.StringIO) -> io.StringIO:
        monkeypatch.setattr(sys, "stderr", stream)
        return stream
    return pointed


def planning(progress: Progress, clock: Clock, seconds: float, step_s: float = 0.5) -> None:
    done = 0
    while seconds > 0:
        progress.step("timing BF x=(32, 64, 56, 56)", f"{done} kernels planned")
        done += 1
        clock.now += step_s
        progress.finished()
        seconds -= step_s


def test_short_planning_shows_nothing(stderr):
    clock, out = Clock(), stderr(io.StringIO())
    progress = Progress(clock=clock)
    planning(progress, clock, AFTER_S - 0.5)
    clock.now += IDLE_S
    progress.idle(lambda: "done")
    assert out.getvalue() == "" and not progress.open


def test_a_log_gets_a_line_every_few_seconds_and_a_closing_one(stderr):
    clock, out = Clock(), stderr(io.StringIO())
    progress = Progress(clock=clock)
    planning(progress, clock, 12.0)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 12.0 / LOG_EVERY_S + 1
    assert lines[0].startswith("ucudnn: planning, 2 s:") and "kernels planned; timing BF" in lines[0]
    progress.idle(lambda: "24 kernels planned")  # too soon after the last step: still open
    assert progress.open
    clock.now += IDLE_S
    progress.idle(lambda: "24 kernels planned")
    assert out.getvalue().splitlines()[-1] == "ucudnn: planned in 12.0 s: 24 kernels planned"
    assert not progress.open


def test_a_stretch_closed_at_once_has_its_closing_line_where_it_was_shown(stderr):
    """A command's end closes its stretch at once (close), where a call that needs no planning
    closes a handle's after IDLE_S (idle)."""
    clock, out = Clock(), stderr(io.StringIO())
    progress = Progress(clock=clock)
    planning(progress, clock, 1.0)
    progress.close(lambda: "short")
    assert out.getvalue() == "" and not progress.open
    planning(progress, clock, 3.0)
    progress.close(lambda: "3 figures")
    assert out.getvalue().splitlines()[-1] == "ucudnn: planned in 3.0 s: 3 figures" and not progress.open


def test_a_terminal_line_is_redrawn_in_place(stderr):
    clock, terminal = Clock(), stderr(Terminal())
    progress = Progress(clock=clock)
    planning(progress, clock, 4.0)
    clock.now += IDLE_S
    progress.idle(lambda: "8 kernels planned")
    text = terminal.getvalue()
    assert text.count("\r\x1b[2K") >= 2 and text.count("\n") == 1 and text.endswith("8 kernels planned\n")


def test_a_disabled_progress_writes_nothing(stderr):
    clock, out = Clock(), stderr(io.StringIO())
    progress = Progress(enabled=False, clock=clock)
    planning(progress, clock, 30.0)
    clock.now += IDLE_S
    progress.idle(lambda: "done")
    assert out.getvalue() == ""


def test_the_setting_silences_it():
    from ucudnn.plan.config import Settings

    assert Settings.load(env={}).progress is True
    assert Settings.load(env={"UCUDNN_PROGRESS": "0"}).progress is False
    assert Settings.load(env={"UCUDNN_PLANNING": "Between_Iterations"}).planning == "between_iterations"


def test_only_rank_zero_says_it_under_torch_distributed(stderr, monkeypatch):
    out = stderr(io.StringIO())
    """torchrun sets RANK in every process: the line (every line of the logger) comes from rank 0 only."""
    for rank, shown in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        clock = Clock()
        planning(Progress(clock=clock), clock, 3.0)
        assert bool(out.getvalue()) is shown, rank


def test_the_line_goes_through_the_ucudnn_logger(monkeypatch):
    """Where nothing put ucudnn's lines on stderr, a logging handler of the user's gets the line,
    and the logger's level silences it."""
    import logging

    out, records = io.StringIO(), []
    monkeypatch.setattr(sys, "stderr", out)
    mine = logging.Handler()
    mine.emit = records.append
    LOGGER.addHandler(mine)
    LOGGER.setLevel(logging.INFO)
    try:
        clock = Clock()
        planning(Progress(clock=clock), clock, 3.0)
        assert records and records[0].name == "ucudnn" and records[0].getMessage().startswith("planning, 2 s:")
        LOGGER.setLevel(logging.WARNING)
        count = len(records)
        planning(Progress(clock=clock), clock, 3.0)
        assert len(records) == count
    finally:
        LOGGER.setLevel(logging.NOTSET)
        LOGGER.removeHandler(mine)
    assert out.getvalue() == ""


def test_a_line_said_meanwhile_stays_above_the_redrawn_one(stderr):
    from ucudnn.core.log import say

    terminal = stderr(Terminal())
    say("step 1", redrawn=True)
    say("a plan")
    say("step 2", redrawn=True)
    say("done")
    assert terminal.getvalue() == ("ucudnn: step 1" "\r\x1b[2Kucudnn: a plan\n" "ucudnn: step 2"
                                   "\r\x1b[2Kucudnn: done\n")
