"""A model's nodes on several streams (ucudnn.integrations.torch.streams) on the CPU: the graph
torch.fx gives, the schedule of it, and a run through stream doubles whose log shows that every
node runs after its inputs, on its stream, with the events the schedule names; results equal the
model's."""
from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from ucudnn.core.errors import ConfigError, UcudnnWarning  # noqa: E402
from ucudnn.integrations.torch.streams import Streamed, graph_nodes, node_times, on_streams, traced  # noqa: E402


class Block(nn.Module):
    """An Inception block: four branches of one input, concatenated."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.branches = nn.ModuleList([nn.Conv2d(channels, 2, k, padding=k // 2) for k in (1, 3, 5)])
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(channels, 2, 1))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        return torch.cat([b(x) for b in self.branches] + [self.pool(x)], 1)


class LoggedStreams:
    """Stream doubles: every operation in a log, events as (stream, position in the log)."""

    def __init__(self):
        self.log = []

    @contextlib.contextmanager
    def on(self, index):
        self.log.append(("on", index))
        yield

    def record(self, index):
        self.log.append(("record", index))
        return (index, len(self.log))

    def wait(self, index, event):
        self.log.append(("wait", index, event))

    def fork(self):
        self.log.append(("fork",))

    def join(self):
        self.log.append(("join",))


def test_an_inception_blocks_branches_run_on_their_own_streams_with_the_models_results():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 8, 8)
    graph = traced(model)
    nodes = {n.name: n for n in graph_nodes(graph, {})}
    convs = [name for name in nodes if name.startswith("branches")]
    assert len(convs) == 3 and all(nodes[c].after == ("relu",) for c in convs)  # each takes the stem's relu
    assert nodes["cat"].after == tuple(sorted([*convs, "pool_1"]))
    times = {name: (3.0 if name.startswith(("branches", "pool")) else 0.5) for name in nodes}
    ops = LoggedStreams()
    streamed = Streamed(model, x, streams=4, times=times, ops=ops)
    with torch.no_grad():
        torch.testing.assert_close(streamed(x), model(x), rtol=0, atol=0)
    plan = streamed.plan
    assert plan.streams == 4 and len({plan.placements[c].stream for c in convs}) == 3
    assert plan.makespan_ms < sum(times.values())
    assert ops.log[0] == ("fork",) and ops.log[-1] == ("join",)
    issued = [entry[1] for entry in ops.log if entry[0] == "on"]  # each node on its stream, in the plan's order
    assert issued == [p.stream for p in plan.placements.values()]
    waits = [(i, entry) for i, entry in enumerate(ops.log) if entry[0] == "wait"]
    assert len(waits) == len(plan.events)
    assert all(recorded_at <= i for i, (_, _, (_, recorded_at)) in waits)  # recorded before it is waited on


def test_a_converted_models_layers_are_nodes_of_its_graph_as_torchs_own_are():
    """A converted layer reads its input's metadata to decide how to run: traced into, it would
    meet fx's proxies ("symbolically traced variables cannot be used as inputs to control flow")."""
    import ucudnn.torch as ut

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 3, 8, 8)
    want = {n.name: (n.op, n.target) for n in traced(model).graph.nodes}
    ut.convert(model)
    graph = traced(model)
    assert {n.name: (n.op, n.target) for n in graph.graph.nodes} == want
    assert isinstance(graph.get_submodule("branches.0"), ut.Conv2d)
    with torch.no_grad(), pytest.warns(UcudnnWarning, match="input on cpu"):
        torch.testing.assert_close(Streamed(model, x, streams=4, ops=LoggedStreams(), times={})(x), model(x),
                                   rtol=0, atol=0)


def test_node_times_run_every_node_alone_with_the_timer_given():
    model = Block().eval()
    graph = traced(model)
    seen = []

    def timer(run):
        seen.append(run())
        return 2.0
    with torch.no_grad():
        times = node_times(graph, (torch.randn(1, 3, 8, 8),), timer, repeats=3)
    assert set(times) == {n.name for n in graph_nodes(graph, {})} and set(times.values()) == {2.0}
    assert len(seen) == 3 * len(times)


def test_a_model_fx_cannot_trace_is_refused_with_fxs_reason():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # data-dependent control flow

    with pytest.raises(ConfigError, match="Branchy cannot be traced by torch.fx.*one stream"):
        traced(Branchy())
    model, x = Branchy(), torch.randn(1, 3, 8, 8)
    with pytest.warns(UcudnnWarning, match="Branchy cannot be traced by torch.fx"):
        assert on_streams(model, x, 4) is model  # it runs on one stream, as it is
    block = Block()
    streamed = on_streams(block, x, 4, timer=lambda run: (run(), 1.0)[1], ops=LoggedStreams())
    assert isinstance(streamed, Streamed) and streamed.plan.streams > 1


@pytest.mark.parametrize("critical_first", [False, True])
def test_critical_first_gives_the_critical_paths_stream_the_high_priority(monkeypatch, critical_first):
    """Where streams contend for the GPU, the critical path's kernels go first: the stream that
    runs most of it is made at a high priority (CUDA streams are doubles here)."""
    import ucudnn.integrations.torch.streams as streams

    made = []
    monkeypatch.setattr(streams, "CudaStreams", lambda count, urgent=None: made.append((count, urgent)) or LoggedStreams())
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 3, 8, 8)
    times = {name: (3.0 if name.startswith("branches_2") else 0.5) for name in {n.name for n in traced(model).graph.nodes}}
    streamed = Streamed(model, x, streams=4, times=times, critical_first=critical_first)
    assert made == [(streamed.plan.streams, streamed.plan.critical_stream if critical_first else None)]
    assert streamed.times == times and "branches_2" in streamed.plan.critical_path
    assert streamed.plan.critical_stream == streamed.plan.placements["branches_2"].stream
    with torch.no_grad():
        torch.testing.assert_close(streamed(x), model(x), rtol=0, atol=0)


class FakeStream:
    def __init__(self, name, priority=0):
        self.name, self.priority, self.log = name, priority, []

    def wait_stream(self, other):
        self.log.append(("wait_stream", other.name))

    def wait_event(self, event):
        self.log.append(("wait_event", event.stream))


@pytest.mark.parametrize("urgent", [None, 0, 2])
def test_cuda_streams_map_indices_to_streams_and_make_only_the_urgent_one_high_priority(monkeypatch, urgent):
    """CudaStreams on the CPU with torch.cuda's stream calls as doubles: stream 0 is the current
    stream unless it is the urgent one; the urgent stream alone has the high priority; a run forks
    every stream of its own from the current one and joins them all back into it."""
    import ucudnn.integrations.torch.streams as streams

    current, made = FakeStream("current"), []

    def stream(device=None, priority=0):
        made.append(FakeStream(f"s{len(made)}", priority))
        return made[-1]

    class Event:
        def record(self, s):
            self.stream = s.name
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext(s))
    ops = streams.CudaStreams(3, urgent=urgent)
    assert len(made) == (3 if urgent == 0 else 2)
    assert [s.priority for s in made].count(streams.HIGH_PRIORITY) == (0 if urgent is None else 1)
    by_index = [ops.on(i).__enter__() for i in range(3)]
    assert (by_index[0] is current) == (urgent != 0) and len({s.name for s in by_index}) == 3
    if urgent is not None:
        assert by_index[urgent].priority == streams.HIGH_PRIORITY
    ops.fork()
    assert all(s.log == [("wait_stream", "current")] for s in made)
    ops.wait(1, ops.record(0))
    assert by_index[1].log[-1] == ("wait_event", by_index[0].name)
    ops.join()
    assert current.log == [("wait_stream", s.name) for s in made]
