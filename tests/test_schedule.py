"""The stream schedule: critical paths, list scheduling on synthetic DAGs, events, and workspaces
that nodes running at once never share."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ucudnn.core.errors import ConfigError
from ucudnn.core.schedule import Node, checked, schedule, sharing, stream_workspaces, table
from ucudnn.core.workspace import divide


def inception(branches=(1.0, 2.0, 3.0, 0.5), head: float = 1.0, tail: float = 0.25) -> list[Node]:
    """A head, branches that each need it, and a join that needs them all (an Inception block)."""
    nodes = [Node("head", head, workspace=4096)]
    nodes += [Node(f"b{i}", ms, ("head",), workspace=1000 * (i + 1)) for i, ms in enumerate(branches)]
    return nodes + [Node("join", tail, tuple(f"b{i}" for i in range(len(branches))))]


def backward(layers: int = 4, bd: float = 1.0, bf: float = 0.8) -> list[Node]:
    """A backward pass: BD of each layer needs the BD of the layer after it; BF needs that BD too
    (dy), and nothing needs BF (its dW is for the optimizer step)."""
    nodes = []
    for i in reversed(range(layers)):
        dy = (f"BD{i + 1}",) if i + 1 < layers else ()
        nodes += [Node(f"BD{i}", bd, dy, workspace=2048), Node(f"BF{i}", bf, dy, workspace=8192)]
    return nodes


def ordered(plan, u: str, v: str) -> bool:
    """Whether `u` is done before `v` starts on the GPU: a chain from u to v of stream order
    (one stream runs its nodes in order) and events."""
    after = {n: set() for n in plan.placements}
    for names in plan.order.values():
        for a, b in zip(names, names[1:]):
            after[a].add(b)
    for a, b in plan.events:
        after[a].add(b)
    seen, todo = set(), [u]
    while todo:
        for n in after[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return v in seen


def test_a_chain_runs_on_one_stream_in_order_and_is_its_own_critical_path():
    nodes = [Node("a", 1.0), Node("b", 2.0, ("a",)), Node("c", 0.5, ("b",))]
    plan = schedule(nodes, streams=4)
    assert plan.order == {0: ("a", "b", "c")} and plan.events == ()
    assert plan.makespan_ms == plan.critical_ms == 3.5 and plan.critical_path == ("a", "b", "c")


def test_inception_branches_fork_onto_streams_and_join_with_events():
    plan = schedule(inception(), streams=4)
    assert plan.critical_path == ("head", "b2", "join") and plan.critical_ms == 4.25
    assert plan.makespan_ms == pytest.approx(4.25)  # head + the longest branch + join
    assert len({plan.placements[f"b{i}"].stream for i in range(4)}) == 4
    assert all(ordered(plan, f"b{i}", "join") and ordered(plan, "head", f"b{i}") for i in range(4))
    assert len(plan.events) == 3 + 3  # head to the three branches on other streams, three branches to the join
    three = schedule(inception(), streams=3)  # b3 after b0 on one stream: its wait for head is b0's
    assert ("head", "b3") not in three.events and ordered(three, "head", "b3")
    one = schedule(inception(), streams=1)
    assert one.makespan_ms == pytest.approx(1 + 6.5 + 0.25) and one.events == ()


def test_weight_gradients_run_beside_the_backward_chain():
    """The critical path is the chain of data gradients; with two streams every BF (shorter than
    a BD, and needing the same dy as the BD beside it) overlaps the chain, which alone sets the time."""
    plan = schedule(backward(), streams=2)
    assert plan.critical_path == ("BD3", "BD2", "BD1", "BD0")
    assert plan.makespan_ms == pytest.approx(4 * 1.0)
    assert schedule(backward(), streams=1).makespan_ms == pytest.approx(4 * 1.8)
    bd_streams = {plan.placements[f"BD{i}"].stream for i in range(4)}
    assert len(bd_streams) == 1  # the chain stays on one stream: no event between its links


def test_the_critical_stream_runs_most_of_the_critical_path():
    assert schedule(backward(), streams=2).critical_stream == schedule(backward(), streams=2).placements["BD0"].stream
    plan = schedule(inception(), streams=4)  # head, b2, join: b2 alone on a stream of its own
    on = [plan.placements[n].stream for n in plan.critical_path]
    assert plan.critical_stream == max(set(on), key=lambda s: (on.count(s), -s))
    lone = schedule([Node("a", 1.0)], streams=4)
    assert lone.critical_stream == 0
    tie = schedule([Node("a", 1.0), Node("b", 1.0)], streams=2)  # two nodes, the path one of them
    assert tie.critical_stream == tie.placements[tie.critical_path[0]].stream


def test_stream_workspaces_are_disjoint_and_sized_to_each_streams_largest():
    nodes = backward()
    plan = schedule(nodes, streams=2)
    segments, total = stream_workspaces(nodes, plan)
    by_node = {n: segments[p.stream] for n, p in plan.placements.items()}
    assert sharing(plan, by_node) == []
    assert total == sum(-(-s.size // 256) * 256 for s in segments.values())
    assert {s.size for s in segments.values()} <= {2048, 8192}
    shared = {n: segments[0] for n in plan.placements}  # everything on one segment: concurrent nodes clash
    assert sharing(plan, shared)


def test_bad_graphs_are_refused_with_the_node_named():
    with pytest.raises(ConfigError, match="'b' comes after \\['x'\\]"):
        checked([Node("a", 1.0), Node("b", 1.0, ("x",))])
    with pytest.raises(ConfigError, match="cycle"):
        checked([Node("a", 1.0, ("b",)), Node("b", 1.0, ("a",))])
    with pytest.raises(ConfigError, match="'a' is given twice"):
        checked([Node("a", 1.0), Node("a", 2.0)])
    with pytest.raises(ConfigError, match="negative"):
        checked([Node("a", -1.0)])
    with pytest.raises(ConfigError, match="streams=0"):
        schedule([Node("a", 1.0)], streams=0)


def test_the_table_names_every_stream_the_critical_path_and_the_events():
    text = table(schedule(inception(), streams=2))
    assert text.startswith("2 streams, predicted") and "head -> b2 -> join" in text
    assert "stream 0:" in text and "stream 1:" in text and "event: after" in text


def test_plot_schedule_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from ucudnn.reports.plots import plot_schedule

    path = tmp_path / "schedule.png"
    plot_schedule(schedule(inception(), streams=3), path, "inception block")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@st.composite
def dags(draw):
    """Up to 12 nodes, each after any of the nodes before it, with times and workspaces."""
    count = draw(st.integers(1, 12))
    nodes = []
    for i in range(count):
        after = draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3, unique=True)) if i else []
        nodes.append(Node(f"n{i}", draw(st.floats(0, 5)), tuple(f"n{a}" for a in after),
                          draw(st.integers(0, 10_000))))
    return nodes


@settings(max_examples=150, deadline=None)
@given(dags(), st.integers(1, 4))
def test_every_schedule_keeps_the_dependencies_streams_in_order_and_workspaces_apart(nodes, streams):
    plan = schedule(nodes, streams)
    graph, placed = checked(nodes), plan.placements
    for node in nodes:  # dependencies respected
        assert all(placed[a].end_ms <= placed[node.name].start_ms + 1e-9 for a in node.after)
    for names in plan.order.values():  # one stream runs one node at a time, in its order
        assert all(placed[a].end_ms <= placed[b].start_ms + 1e-9 for a, b in zip(names, names[1:]))
    # every dependency holds on the GPU: stream order and events order it
    assert all(ordered(plan, a, node.name) for node in nodes for a in node.after)
    assert len(plan.events) <= sum(len(node.after) for node in nodes)
    total = sum(n.ms for n in nodes)
    assert plan.critical_ms - 1e-9 <= plan.makespan_ms <= total + 1e-9
    assert plan.streams <= streams and sorted(placed) == sorted(graph)
    segments, _ = stream_workspaces(nodes, plan)
    assert sharing(plan, {n: segments[p.stream] for n, p in placed.items()}) == []
    wd, _ = divide({n.name: n.workspace for n in nodes})  # WD: a segment per kernel
    assert sharing(plan, wd) == []
