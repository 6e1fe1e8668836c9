"""How ucudnn speaks, as a library does: its `ucudnn` logger reaches the application's handlers
(and stderr only where the CLI or `ucudnn.log_to_stderr` puts it there); its UcudnnWarnings come
once per message, from rank 0 only, attributed to the caller's line (ucudnn.core.log, .fallback)."""
from __future__ import annotations

import inspect
import logging
import warnings

import pytest

import ucudnn
from ucudnn.cli import main
from ucudnn.core.errors import UcudnnWarning
from ucudnn.core.log import LOGGER, say
from ucudnn.core.progress import Progress
from ucudnn.execute.graphs import GraphedProgram

from test_graphs import FakeCapturer, Recorder


def test_importing_ucudnn_gives_its_logger_a_null_handler_and_nothing_else():
    assert [type(h) for h in LOGGER.handlers] == [logging.NullHandler]
    assert LOGGER.level == logging.NOTSET and LOGGER.propagate


@pytest.fixture
def root_records():
    """The records a handler on the root logger gets, at INFO (as `logging.basicConfig(level=logging.INFO)`)."""
    root, records = logging.getLogger(), []
    handler, level = logging.Handler(), root.level
    handler.emit = records.append
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield records
    root.removeHandler(handler)
    root.setLevel(level)


def test_the_applications_root_handler_gets_the_progress_line(root_records):
    """ucudnn's own stderr handler kept its records from the application's handlers."""
    clock = iter(range(100, 200)).__next__
    progress = Progress(clock=clock)
    for _ in range(4):
        progress.step("timing F", "0 kernels planned")
    assert [r.name for r in root_records] == ["ucudnn"]
    assert root_records[0].getMessage().startswith("planning, 2 s: 0 kernels planned")


@pytest.fixture
def logger_restored():
    handlers, level = list(LOGGER.handlers), LOGGER.level
    yield
    LOGGER.handlers[:], LOGGER.level = handlers, level


def test_log_to_stderr_writes_the_lines_once_however_often_it_is_called(logger_restored, capsys):
    handler = ucudnn.log_to_stderr()
    assert ucudnn.log_to_stderr() is handler and LOGGER.handlers.count(handler) == 1
    say("a plan")
    assert capsys.readouterr().err == "ucudnn: a plan\n"
    LOGGER.removeHandler(handler)
    say("a plan")
    assert capsys.readouterr().err == ""


def test_log_to_stderr_writes_nothing_on_other_ranks(logger_restored, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    ucudnn.log_to_stderr()
    say("a plan")
    assert capsys.readouterr().err == ""


def test_the_cli_writes_the_lines_on_stderr_and_leaves_the_logger_as_it_was(capsys, monkeypatch):
    monkeypatch.setenv("UCUDNN_VERBOSE", "1")
    assert main(["optimize", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB"]) == 0
    assert "ucudnn: conv1/F: " in capsys.readouterr().err
    assert [type(h) for h in LOGGER.handlers] == [logging.NullHandler] and LOGGER.level == logging.NOTSET


def _capture_fails(kernel: str = "conv2/F") -> None:
    """A graphed program whose capture fails: it warns (UcudnnWarning) on its second call."""
    graphed = GraphedProgram(Recorder(), FakeCapturer(fail=True), kernel=kernel)
    graphed(1, 2, 3)
    graphed(1, 2, 3)


def test_a_warning_is_given_once_per_process():
    """Two programs of one kernel (two handles, or a handle rebuilt) warned twice."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _capture_fails()
        _capture_fails()
        _capture_fails("conv3/F")
    assert [str(w.message).split()[4] for w in caught] == ["conv2/F", "conv3/F"]


def test_a_warning_is_not_given_on_other_ranks(monkeypatch):
    """torchrun's ranks each gave every warning."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        _capture_fails()


def test_a_warning_points_at_the_line_that_led_to_it():
    graphed = GraphedProgram(Recorder(), FakeCapturer(fail=True), kernel="conv2/F")
    graphed(1, 2, 3)
    with pytest.warns(UcudnnWarning) as caught:
        graphed(1, 2, 3)
    line = inspect.currentframe().f_lineno - 1  # the call's
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_a_warning_from_inside_a_layer_call_points_at_the_callers_line():
    """It pointed into torch's nn.Module.__call__, the frame that called ucudnn's forward."""
    torch = pytest.importorskip("torch")
    import ucudnn.torch as ut

    conv = ut.convert(torch.nn.Conv2d(2, 2, 3))
    with pytest.warns(UcudnnWarning, match="input on cpu") as caught:
        conv(torch.randn(1, 2, 5, 5))
    line = inspect.currentframe().f_lineno - 1  # the call's
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
