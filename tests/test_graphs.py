"""Graph execution logic (ucudnn.execute.graphs) with a fake capturer: when graphs are captured, kept,
replayed and given up on, and that replays compute what direct dispatch does (NumPy reference)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from ucudnn.core.errors import GraphCaptureError, UcudnnWarning
from ucudnn.core.problem import ConvProblem
from ucudnn.execute.graphs import CHURN_CAPTURES, GraphedProgram

from executors import array_program
from test_dispatch import configuration, expected_output, make_operands


class FakeGraph:
    def __init__(self, run):
        self.run = run


class FakeCapturer:
    """Captures by keeping the thunk (running nothing, as stream capture queues nothing);
    a launch runs it. `fail` makes every capture raise; `busy` says the caller is capturing."""

    def __init__(self, fail: bool = False, busy: bool = False):
        self.fail, self.busy = fail, busy
        self.captured, self.launched = [], []

    def capture(self, run):
        if self.fail:
            raise GraphCaptureError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")
        graph = FakeGraph(run)
        self.captured.append(graph)
        return graph

    def launch(self, graph):
        self.launched.append(graph)
        graph.run()

    def capturing(self):
        return self.busy


class Recorder:
    """A program that records the addresses it ran with."""

    def __init__(self):
        self.runs = []

    def __call__(self, *addresses):
        self.runs.append(addresses)


def test_first_run_direct_second_captures_then_replays():
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer)
    for _ in range(4):
        graphed(1, 2, 3, 4, 5)
    assert len(capturer.captured) == 1 and len(capturer.launched) == 3
    assert program.runs == [(1, 2, 3, 4, 5)] * 4  # one direct run, three replays of the capture
    assert (graphed.direct_runs, graphed.captures, graphed.replays) == (1, 1, 3)


def test_each_set_of_addresses_gets_its_own_graph():
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer)
    for addresses in [(1, 2, 3, 0, 0), (7, 2, 3, 0, 0), (1, 2, 3, 0, 0), (7, 2, 3, 0, 0), (1, 2, 3, 9, 64)]:
        graphed(*addresses)
    assert set(graphed.graphs) == {(1, 2, 3, 0, 0), (7, 2, 3, 0, 0)}
    assert program.runs[-1] == (1, 2, 3, 9, 64)  # another workspace is another graph: first run direct
    assert graphed.direct_runs == 3


def test_addresses_that_never_repeat_are_never_captured():
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer, max_seen=4)
    for x in range(100):
        graphed(x, 1, 2)
    assert capturer.captured == [] and graphed.direct_runs == 100 and len(graphed._seen) == 4


def test_a_kernel_whose_graphs_are_not_replayed_stops_capturing():
    """Address sets that come back once, then never (the churn of an allocator placing tensors anew):
    after CHURN_CAPTURES captures launched only once each, new sets run directly; old graphs still
    replay, and capturing resumes once replays catch up."""
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer, max_graphs=1000)
    c = CHURN_CAPTURES
    for x in range(3 * c):
        graphed(x, 0, 0)
        graphed(x, 0, 0)
    assert graphed.captures == c and graphed.replays == c  # each capture launched once, never again
    assert graphed.direct_runs == c + 2 * 2 * c
    for x in range(c):
        graphed(x, 0, 0)  # the captured sets do come back: replayed
    assert not graphed._churning()
    graphed(-1, 0, 0)
    graphed(-1, 0, 0)
    assert graphed.captures == c + 1
    assert len(program.runs) == graphed.direct_runs + graphed.replays  # every call ran once


def test_a_kernel_with_many_repeating_address_sets_gets_them_all_captured():
    """A kernel shared by many layers, each set coming back every iteration: the sets beyond
    CHURN_CAPTURES are captured at most two iterations later than the rest, then all replay."""
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer, max_graphs=1000)
    sets = CHURN_CAPTURES + 8
    for iteration in range(4):
        for x in range(sets):
            graphed(x, 0, 0)
    late = sets - CHURN_CAPTURES
    assert graphed.captures == sets and graphed.direct_runs <= sets + 2 * late
    graphed.replays = 0
    for x in range(sets):
        graphed(x, 0, 0)
    assert graphed.replays == sets


def test_graphs_beyond_the_bound_drop_the_least_recently_used():
    graphed = GraphedProgram(Recorder(), FakeCapturer(), max_graphs=2)
    for x in (1, 1, 2, 2, 1, 3, 3):  # 1 replayed after 2 was captured: 2 is the oldest when 3 comes
        graphed(x, 0, 0)
    assert list(graphed.graphs) == [(1, 0, 0, 0, 0), (3, 0, 0, 0, 0)]


def test_a_capture_failure_warns_once_and_runs_directly_from_then_on():
    program, capturer = Recorder(), FakeCapturer(fail=True)
    graphed = GraphedProgram(program, capturer, kernel="conv2/F")
    graphed(1, 2, 3)
    with pytest.warns(UcudnnWarning, match=r"conv2/F cannot be captured.*StreamCaptureUnsupported.*UCUDNN_EXECUTION=direct"):
        graphed(1, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            graphed(1, 2, 3)
    assert len(program.runs) == 5 and graphed.direct_runs == 5  # every call still ran, once
    assert "StreamCaptureUnsupported" in graphed.capture_failure


def test_a_caller_that_is_capturing_gets_direct_calls_into_its_own_graph():
    program, capturer = Recorder(), FakeCapturer(busy=True)
    graphed = GraphedProgram(program, capturer)
    for _ in range(3):
        graphed(1, 2, 3)
    assert capturer.captured == [] and graphed.direct_runs == 3


def test_a_caller_that_warmed_up_before_capturing_gets_direct_calls_not_our_graph():
    """torch.cuda.graph's warm-up runs the step on the operands it then captures with: by then a
    graph of ours exists for them, and a graph cannot be launched into a capturing stream."""
    program, capturer = Recorder(), FakeCapturer()
    graphed = GraphedProgram(program, capturer)
    for _ in range(3):  # warm-up: direct, capture and launch, launch
        graphed(1, 2, 3)
    launched = len(capturer.launched)
    capturer.busy = True
    graphed(1, 2, 3)
    assert len(capturer.launched) == launched and program.runs[-1] == (1, 2, 3, 0, 0)
    capturer.busy = False
    graphed(1, 2, 3)
    assert len(capturer.launched) == launched + 1  # outside the caller's capture, ours again


@pytest.mark.parametrize("kind, alpha, beta", [("F", 1.0, 0.0), ("BD", 0.5, 1.5), ("BF", 2.0, 0.75)])
def test_replays_compute_what_direct_dispatch_does(kind, alpha, beta):
    """BF accumulates (beta, then 1) and beta != 0 blends: a replay must run each call exactly
    once, in order, on the same memory, or these differ from the undivided reference."""
    p = ConvProblem(kind, (7, 3, 9, 9), (4, 3, 3, 3), pads=(1, 1), strides=(2, 1), dtype="float64")
    program = array_program(p, configuration([3, 3, 1]), alpha, beta)
    memory = {}  # address -> the array "at" it; refilled before each call, as a training loop does
    graphed = GraphedProgram(lambda x, w, y, ws, n: program(memory[x], memory[w], memory[y], ws, n),
                             FakeCapturer())
    rng = np.random.default_rng(0)
    for _ in range(4):  # direct, capture + replay, replay, replay
        flats = make_operands(p, rng)
        memory.update({11: flats["x"], 22: flats["w"], 33: flats["y"]})
        expected = expected_output(p, flats, alpha, beta)
        graphed(11, 22, 33)
        written = flats[{"F": "y", "BD": "x", "BF": "w"}[kind]]
        np.testing.assert_allclose(written, expected, rtol=1e-12, atol=1e-12)
    assert (graphed.direct_runs, graphed.captures, graphed.replays) == (1, 1, 3)


class FakeRuntime:
    """cupy.cuda.runtime's graph calls: graphInstantiate fails with `failures` statuses first."""

    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    def __init__(self, failures=(), failing="graphInstantiate"):
        self.failures, self.failing, self.calls = list(failures), failing, []
        self.free, self.graph_bytes = 2**30, 0

    def __getattr__(self, name):  # every other runtime call: recorded, returns a handle
        return lambda *args: self._call(name)

    def graphInstantiate(self, graph):
        instantiated = self._call("graphInstantiate")
        self.free -= self.graph_bytes
        return instantiated

    def memGetInfo(self):  # the device's free and total bytes: each graph takes graph_bytes
        return self.free, 2**40

    def _call(self, name):
        self.calls.append(name)
        if name == self.failing and self.failures:
            raise self.CUDARuntimeError(self.failures.pop(0))
        return 11 if name == "graphInstantiate" else 7


def fake_cupy(monkeypatch, runtime):
    from types import SimpleNamespace

    from ucudnn.execute import graphs

    monkeypatch.setattr(graphs, "cupy", lambda: SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    return graphs


@pytest.mark.parametrize("make_room", [True, False])
def test_a_graph_without_device_memory_is_instantiated_again_after_making_room(monkeypatch, make_room):
    runtime, made = FakeRuntime(failures=[2]), []  # cudaErrorMemoryAllocation, once
    graphs = fake_cupy(monkeypatch, runtime)
    capturer = graphs.GraphCapturer(lambda stream: None, lambda: 3,
                                    (lambda: made.append(runtime.calls.count("graphInstantiate"))) if make_room else None)
    if make_room:
        assert capturer.capture(lambda: None)._executable == 11
        assert made == [1] and runtime.calls.count("graphInstantiate") == 2  # room made between the two tries
    else:
        with pytest.raises(GraphCaptureError, match="status 2"):
            capturer.capture(lambda: None)


def test_the_capture_stream_is_made_again_after_making_room_where_memory_ran_out(monkeypatch):
    runtime, made = FakeRuntime(failures=[2], failing="streamCreateWithFlags"), []
    graphs = fake_cupy(monkeypatch, runtime)
    graphs.GraphCapturer(lambda stream: None, lambda: 3, lambda: made.append(True))
    assert made == [True] and runtime.calls.count("streamCreateWithFlags") == 2
    runtime = FakeRuntime(failures=[2, 2], failing="streamCreateWithFlags")
    graphs = fake_cupy(monkeypatch, runtime)
    with pytest.raises(FakeRuntime.CUDARuntimeError, match="status 2"):  # out of memory even then: raised
        graphs.GraphCapturer(lambda stream: None, lambda: 3, lambda: None)


def test_other_instantiation_failures_are_not_retried(monkeypatch):
    runtime, made = FakeRuntime(failures=[1]), []  # cudaErrorInvalidValue
    graphs = fake_cupy(monkeypatch, runtime)
    capturer = graphs.GraphCapturer(lambda stream: None, lambda: 3, lambda: made.append(True))
    with pytest.raises(GraphCaptureError, match="status 1"):
        capturer.capture(lambda: None)
    assert made == [] and runtime.calls.count("graphInstantiate") == 1


def test_the_benchmarkers_capturer_makes_room_as_the_handles_does(monkeypatch):
    """Under memory pressure a candidate's graph that cannot be instantiated would be recorded
    FAILED (and never measured again): the benchmarker's capturer makes room too."""
    from types import SimpleNamespace

    from ucudnn.measure import benchmark

    runtime, made = FakeRuntime(failures=[2]), []
    fake_cupy(monkeypatch, runtime)
    backends = SimpleNamespace(set_stream=lambda stream: None)
    capturer = benchmark._capturer("graph", backends, 3, lambda: made.append(True))
    assert capturer.capture(lambda: None)._executable == 11 and made == [True]
    assert benchmark._capturer("direct", backends, 3, lambda: made.append(True)) is None


def test_a_graph_that_cannot_get_its_memory_even_after_making_room_leaves_the_calls_direct_and_right(monkeypatch):
    """Under memory pressure a capture can fail for its instantiation's bytes twice (room made
    between the tries): the call that would have captured runs directly instead, with the
    undivided result, and so do the later ones, one warning in all; nothing raises."""
    runtime, made = FakeRuntime(failures=[2, 2]), []
    graphs = fake_cupy(monkeypatch, runtime)
    capturer = graphs.GraphCapturer(lambda stream: None, lambda: 3, lambda: made.append(True))
    monkeypatch.setattr(capturer, "capturing", lambda: False)  # the caller's stream is not capturing
    monkeypatch.setattr(capturer, "launch", lambda graph: pytest.fail("no graph was instantiated to launch"))
    p = ConvProblem("F", (5, 3, 8, 8), (4, 3, 3, 3), pads=(1, 1), dtype="float64")
    program = array_program(p, configuration([2, 3]), 1.0, 0.0)
    memory = {}
    graphed = GraphedProgram(lambda x, w, y, ws, n: program(memory[x], memory[w], memory[y], ws, n), capturer,
                             kernel="conv/F")
    rng = np.random.default_rng(0)
    with pytest.warns(UcudnnWarning, match=r"conv/F cannot be captured.*status 2"):
        for _ in range(3):  # direct, a capture that fails (run directly), direct
            flats = make_operands(p, rng)
            memory.update({11: flats["x"], 22: flats["w"], 33: flats["y"]})
            graphed(11, 22, 33)
            np.testing.assert_allclose(flats["y"], expected_output(p, flats, 1.0, 0.0), rtol=1e-12, atol=1e-12)
    assert made == [True] and runtime.calls.count("graphInstantiate") == 2
    assert (graphed.direct_runs, graphed.captures, graphed.replays) == (3, 0, 0)
