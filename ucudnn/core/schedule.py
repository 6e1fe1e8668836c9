"""Independent work of a network on several streams: a critical-path list schedule of a DAG of
nodes with measured times (the critical-path paper's priority rule), the events that join the
streams, and workspaces that concurrent nodes never share.

- The priority of a node is its bottom level: its own time plus the longest path of times from it
  to the end. The critical path is the chain of largest bottom levels from the start; delaying a
  node on it delays the whole.
- List scheduling: of the nodes whose predecessors are placed, the one of highest priority goes
  first, on the stream where it can start earliest (ties: the stream of its latest predecessor,
  which needs no event; then the lowest). The predicted times assume that nodes running at once
  do not slow each other down, which they do where they contend for the GPU: the schedule is a
  plan to measure, not a measurement.
- A node waits for a predecessor on another stream through an event recorded after it, unless
  its stream already waited for that point of that stream or a later one (a stream runs in
  order; knowledge passes through events: vector clocks).
- Workspaces: nodes on one stream run one after another and share that stream's workspace, sized
  to its largest; the streams' workspaces are disjoint segments of one buffer (`stream_workspaces`).
  WD's division gives every kernel a segment of its own, which is disjoint already.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .workspace import Segment, divide


@dataclass(frozen=True)
class Node:
    """A unit of work: its measured milliseconds, the nodes it needs done first, its workspace bytes."""

    name: str
    ms: float
    after: tuple[str, ...] = ()
    workspace: int = 0


@dataclass(frozen=True)
class Placement:
    """Where and when a node runs in the schedule: its stream and predicted start and end (ms)."""

    stream: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class Schedule:
    """Nodes placed on streams (in the order each stream runs them), the events joining the
    streams ((after this node, before that one)), and the predicted critical path."""

    placements: dict[str, Placement]
    order: dict[int, tuple[str, ...]]  # stream -> its nodes in issue order
    events: tuple[tuple[str, str], ...]
    critical_path: tuple[str, ...]
    critical_ms: float

    @property
    def makespan_ms(self) -> float:
        return max((p.end_ms for p in self.placements.values()), default=0.0)

    @property
    def streams(self) -> int:
        return len(self.order)

    @property
    def critical_stream(self) -> int:
        """The stream that runs most of the critical path's nodes (the lowest of a tie): the one
        to run first where streams contend for the GPU."""
        counts = Counter(self.placements[n].stream for n in self.critical_path)
        return min(counts, key=lambda s: (-counts[s], s), default=0)


def checked(nodes: Iterable[Node]) -> dict[str, Node]:
    """The nodes by name, in a topological order; ConfigError naming a repeated name, an unknown
    predecessor, a negative time or workspace, or a node on a cycle."""
    by_name: dict[str, Node] = {}
    for node in nodes:
        if node.name in by_name:
            raise ConfigError(f"node {node.name!r} is given twice; every node needs a name of its own")
        if node.ms < 0 or node.workspace < 0:
            raise ConfigError(f"node {node.name!r} has ms={node.ms} and workspace={node.workspace}; neither can be negative")
        by_name[node.name] = node
    for node in by_name.values():
        unknown = [a for a in node.after if a not in by_name]
        if unknown:
            raise ConfigError(f"node {node.name!r} comes after {unknown}, which are not nodes of the graph")
    ordered: dict[str, Node] = {}
    waiting = dict(by_name)
    while waiting:
        ready = [n for n in waiting.values() if all(a in ordered for a in n.after)]
        if not ready:
            raise ConfigError(f"the nodes {sorted(waiting)[:5]} wait on each other (a cycle); the graph must be acyclic")
        for node in ready:
            ordered[node.name] = waiting.pop(node.name)
    return ordered


def successors(nodes: Mapping[str, Node]) -> dict[str, list[str]]:
    """Each node's name -> the nodes that come after it."""
    after: dict[str, list[str]] = {name: [] for name in nodes}
    for node in nodes.values():
        for a in node.after:
            after[a].append(node.name)
    return after


def bottom_levels(nodes: Mapping[str, Node]) -> dict[str, float]:
    """Each node's time plus the longest chain of times after it (`nodes` in topological order)."""
    after = successors(nodes)
    levels: dict[str, float] = {}
    for name in reversed(list(nodes)):
        levels[name] = nodes[name].ms + max((levels[s] for s in after[name]), default=0.0)
    return levels


def critical_path(nodes: Mapping[str, Node], levels: Mapping[str, float]) -> tuple[str, ...]:
    """The chain of largest bottom levels from the start: the nodes no schedule can overlap."""
    if not nodes:
        return ()
    after = successors(nodes)
    path = [max((n for n in nodes.values() if not n.after), key=lambda n: levels[n.name]).name]
    while after[path[-1]]:
        path.append(max(after[path[-1]], key=lambda s: levels[s]))
    return tuple(path)


def schedule(nodes: Iterable[Node], streams: int) -> Schedule:
    """A critical-path list schedule of `nodes` on at most `streams` streams (see the module's
    docstring)."""
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise ConfigError(f"streams={streams!r} must be a positive number")
    graph = checked(nodes)
    levels = bottom_levels(graph)
    free = [0.0] * streams
    placements: dict[str, Placement] = {}
    order: dict[int, list[str]] = {}
    pending = sorted(graph, key=lambda n: -levels[n])  # highest priority first
    while pending:
        name = next(n for n in pending if all(a in placements for a in graph[n].after))
        pending.remove(name)
        node = graph[name]
        ready = max((placements[a].end_ms for a in node.after), default=0.0)
        last = max(node.after, key=lambda a: placements[a].end_ms, default=None)
        home = placements[last].stream if last is not None else None
        stream = min(range(streams), key=lambda s: (max(free[s], ready), s != home, s))
        start = max(free[stream], ready)
        placements[name] = Placement(stream, start, start + node.ms)
        free[stream] = start + node.ms
        order.setdefault(stream, []).append(name)
    path = critical_path(graph, levels)
    return Schedule(placements, {s: tuple(names) for s, names in sorted(order.items())},
                    _events(graph, placements, order), path, sum(graph[n].ms for n in path))


def _events(graph: Mapping[str, Node], placements: Mapping[str, Placement],
            order: Mapping[int, Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """The events a node waits on: for a predecessor on another stream, one recorded after it,
    unless the node's stream already waited for that point of that stream or a later one (itself,
    or through another stream that had: each node's knowledge of the streams is a vector clock).
    `placements` is in the order the nodes were placed, which each stream runs them in."""
    position = {name: i for names in order.values() for i, name in enumerate(names)}
    clocks: dict[str, dict[int, int]] = {}
    last_on: dict[int, str] = {}
    events = []
    for name in placements:
        stream = placements[name].stream
        clock = dict(clocks[last_on[stream]]) if stream in last_on else {}
        for a in sorted(graph[name].after, key=lambda a: -placements[a].end_ms):
            s = placements[a].stream
            if s != stream and clock.get(s, -1) < position[a]:
                events.append((a, name))
                for t, known in clocks[a].items():
                    clock[t] = max(clock.get(t, -1), known)
        clock[stream] = position[name]
        clocks[name], last_on[stream] = clock, name
    return tuple(events)


def stream_workspaces(nodes: Iterable[Node], plan: Schedule) -> tuple[dict[int, Segment], int]:
    """Each stream's workspace: a segment of one buffer as large as the largest workspace of its
    nodes (they run one after another), the segments disjoint; and the buffer's bytes."""
    sizes = {node.name: node.workspace for node in nodes}
    return divide({s: max((sizes[n] for n in names), default=0) for s, names in plan.order.items()})


def sharing(plan: Schedule, segments: Mapping[str, Segment]) -> list[tuple[str, str]]:
    """Pairs of nodes predicted to run at once whose workspace segments (by node) share bytes:
    what no plan may have. Empty for stream_workspaces' and for WD's segments."""
    clashes = []
    names = sorted(plan.placements, key=lambda n: plan.placements[n].start_ms)
    for i, a in enumerate(names):
        pa = plan.placements[a]
        for b in names[i + 1:]:
            pb = plan.placements[b]
            if pb.start_ms >= pa.end_ms:
                break
            sa, sb = segments[a], segments[b]
            if pa.stream != pb.stream and sa.size and sb.size and sa.offset < sb.end and sb.offset < sa.end:
                clashes.append((a, b))
    return clashes


def table(plan: Schedule) -> str:
    """The schedule as text: per stream its nodes with predicted start and end, then the critical path."""
    lines = [f"{plan.streams} streams, predicted {plan.makespan_ms:.3f} ms "
             f"(critical path {plan.critical_ms:.3f} ms: {' -> '.join(plan.critical_path)})"]
    for stream, names in plan.order.items():
        cells = (f"{n} [{plan.placements[n].start_ms:.3f}, {plan.placements[n].end_ms:.3f}]" for n in names)
        lines.append(f"stream {stream}: " + ", ".join(cells))
    lines += [f"event: after {u}, before {v}" for u, v in plan.events]
    return "\n".join(lines)
