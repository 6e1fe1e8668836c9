"""The progress line of long planning (ucudnn.progress), on a fake clock."""
from __future__ import annotations

import io

from ucudnn.progress import AFTER_S, IDLE_S, LOG_EVERY_S, Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def planning(progress: Progress, clock: Clock, seconds: float, step_s: float = 0.5) -> None:
    done = 0
    while seconds > 0:
        progress.step("timing BF x=(32, 64, 56, 56)", f"{done} kernels planned")
        done += 1
        clock.now += step_s
        progress.finished()
        seconds -= step_s


def test_short_planning_shows_nothing():
    clock, out = Clock(), io.StringIO()
    progress = Progress(stream=out, clock=clock)
    planning(progress, clock, AFTER_S - 0.5)
    clock.now += IDLE_S
    progress.idle(lambda: "done")
    assert out.getvalue() == "" and not progress.open


def test_a_log_gets_a_line_every_few_seconds_and_a_closing_one():
    clock, out = Clock(), io.StringIO()
    progress = Progress(stream=out, clock=clock)
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


def test_a_terminal_line_is_redrawn_in_place():
    clock, out = Clock(), Terminal()
    progress = Progress(stream=out, clock=clock)
    planning(progress, clock, 4.0)
    clock.now += IDLE_S
    progress.idle(lambda: "8 kernels planned")
    text = out.getvalue()
    assert text.count("\r\x1b[2K") >= 2 and text.count("\n") == 1 and text.endswith("8 kernels planned\n")


def test_a_disabled_progress_writes_nothing():
    clock, out = Clock(), io.StringIO()
    progress = Progress(enabled=False, stream=out, clock=clock)
    planning(progress, clock, 30.0)
    clock.now += IDLE_S
    progress.idle(lambda: "done")
    assert out.getvalue() == ""


def test_the_setting_silences_it():
    from ucudnn.config import Settings

    assert Settings.load(env={}).progress is True
    assert Settings.load(env={"UCUDNN_PROGRESS": "0"}).progress is False
    assert Settings.load(env={"UCUDNN_PLANNING": "Between_Iterations"}).planning == "between_iterations"
