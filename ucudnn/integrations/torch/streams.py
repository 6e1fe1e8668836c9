"""A model's independent work on several CUDA streams: its graph (torch.fx), each node's measured
time, a critical-path schedule of them (ucudnn.core.schedule), and a run that issues each node on its
stream, in the schedule's order, with the events the schedule names.

    streamed = Streamed(model, x, streams=4)      # traced, timed on x, scheduled
    y = streamed(x)                               # each node on its stream; equals model(x)
    print(ucudnn.core.schedule.table(streamed.plan))

    model = on_streams(model, x, streams=4)       # the same, or the model itself on one stream
                                                  # where torch.fx cannot trace it (with a warning)

A run forks the side streams from the current stream first (they wait for what came before) and
joins them into it last (what comes after waits for them), and keeps every intermediate tensor
until the join: a tensor made on one stream and read on another is never handed out again while
the reader may still run. Capture the run as one CUDA graph (torch.cuda.graph): issued eagerly,
the host's extra stream and event calls cost more than the concurrency gains. A model that
torch.fx cannot trace (data-dependent control flow) raises ConfigError with fx's reason (Streamed),
or runs on one stream as it is, with that reason in a warning (on_streams).
tests/test_gpu_streams.py checks outputs against one stream on a GPU; docs/results.md
("Independent work on several streams") has the speedups.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
from torch import nn

from ...core.errors import ConfigError
from ...core.fallback import say_once
from ...core.schedule import Node, Schedule, schedule
from .layers import Converted

COMPUTE = ("call_module", "call_function", "call_method")


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, with converted layers as leaves as torch's own layers are: a converted
    layer decides from its input's metadata how to run, which a traced proxy does not have."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, Converted) or super().is_leaf_module(module, qualified_name)


def traced(model: nn.Module) -> torch.fx.GraphModule:
    """The model's graph, each layer (converted or torch's own) one node; ConfigError with
    torch.fx's reason where it cannot be traced."""
    try:
        return torch.fx.GraphModule(model, _Tracer().trace(model), type(model).__name__)
    except Exception as exc:  # fx raises TraceError, TypeError, ... on data-dependent control flow
        raise ConfigError(f"{type(model).__name__} cannot be traced by torch.fx ({type(exc).__name__}: {exc}); "
                          "run it on one stream") from exc


def graph_nodes(graph: torch.fx.GraphModule, times: Mapping[str, float]) -> list[Node]:
    """The graph's compute nodes as schedule nodes: `times` (ms by node name; 0 where absent),
    after the compute nodes whose outputs they take (through any number of other nodes)."""
    compute: dict[str, tuple[str, ...]] = {}
    feeds: dict[str, set[str]] = {}  # any node -> the compute nodes behind it
    for node in graph.graph.nodes:
        behind = set().union(*(feeds[a.name] for a in node.all_input_nodes)) if node.all_input_nodes else set()
        if node.op in COMPUTE:
            compute[node.name] = tuple(sorted(behind))
            behind = {node.name}
        feeds[node.name] = behind
    return [Node(name, float(times.get(name, 0.0)), after) for name, after in compute.items()]


def node_times(graph: torch.fx.GraphModule, args: tuple, timer: Callable[[Callable[[], Any]], float],
               repeats: int = 5) -> dict[str, float]:
    """Each compute node's milliseconds, by `timer(run)` (the median of `repeats`), run alone on
    the outputs the graph gave its inputs on `args`."""
    values = _values(graph, args)
    times = {}
    for node in graph.graph.nodes:
        if node.op in COMPUTE:
            call = _call(graph, node, values)
            times[node.name] = statistics.median(timer(call) for _ in range(repeats))
    return times


def cuda_timer(run: Callable[[], Any]) -> float:
    """Milliseconds of one run() on the current CUDA stream, by events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


HIGH_PRIORITY = -1  # torch.cuda.Stream's priority above the default 0 (lower numbers are higher)


class CudaStreams:
    """The streams a run issues on: stream 0 the stream current when the run starts (a graph's
    capture stream inside torch.cuda.graph), the others made once. Stream `urgent`, where given,
    is made at a high priority (stream 0 then too, rather than the current one):
    where kernels of several streams wait for the GPU, its kernels are scheduled first."""

    def __init__(self, count: int, device: torch.device | None = None, urgent: int | None = None):
        self.device = device
        self.current = torch.cuda.current_stream(device)
        self._made = [None if i == 0 and urgent != 0 else
                      torch.cuda.Stream(device, priority=HIGH_PRIORITY if i == urgent else 0) for i in range(count)]
        self._own = [stream for stream in self._made if stream is not None]  # forked and joined each run

    def _stream(self, index: int) -> Any:
        made = self._made[index]
        return self.current if made is None else made

    def on(self, index: int):
        return torch.cuda.stream(self._stream(index))

    def record(self, index: int) -> Any:
        event = torch.cuda.Event()
        event.record(self._stream(index))
        return event

    def wait(self, index: int, event: Any) -> None:
        self._stream(index).wait_event(event)

    def fork(self) -> None:
        self.current = torch.cuda.current_stream(self.device)
        for stream in self._own:
            stream.wait_stream(self.current)

    def join(self) -> None:
        for stream in self._own:
            self.current.wait_stream(stream)


class Streamed(nn.Module):
    """`model` run with its independent nodes on `streams` streams (see the module's docstring):
    traced, each node timed on `example` (a tuple of positional arguments, or one tensor) with
    `timer` (cuda_timer: CUDA events), and scheduled by the critical path. `ops` issues the
    streams and events (CudaStreams by default; tests pass doubles). With `critical_first` (the
    default), the stream that runs most of the critical path has a high priority: inside one CUDA
    graph on an H100 it is as fast or faster in every model measured (docs/results.md,
    "Independent work on several streams").
    `times`: the nodes' milliseconds, measured already (kept as `times` either way)."""

    def __init__(self, model: nn.Module, example: Any, streams: int, *, timer=cuda_timer, ops=None,
                 times: Mapping[str, float] | None = None, critical_first: bool = True):
        super().__init__()
        self.graph = traced(model)
        args = example if isinstance(example, tuple) else (example,)
        with torch.no_grad():
            self.times = dict(times) if times is not None else node_times(self.graph, args, timer)
        self.plan: Schedule = schedule(graph_nodes(self.graph, self.times), streams)
        urgent = self.plan.critical_stream if critical_first else None
        self.ops = ops if ops is not None else CudaStreams(self.plan.streams, urgent=urgent)
        self._fx = {n.name: n for n in self.graph.graph.nodes}
        self._waits: dict[str, list[str]] = {}  # node -> the nodes whose events it waits on
        for u, v in self.plan.events:
            self._waits.setdefault(v, []).append(u)
        self._senders = {u for u, _ in self.plan.events}

    def forward(self, *args):
        values = _bind(self.graph, args)
        recorded: dict[str, Any] = {}  # node -> the event recorded after it
        self.ops.fork()
        for name, placement in self.plan.placements.items():  # the order the schedule placed them in
            stream = placement.stream
            for u in self._waits.get(name, ()):
                self.ops.wait(stream, recorded[u])
            with self.ops.on(stream):
                values[name] = _call(self.graph, self._fx[name], values)()
            if name in self._senders:
                recorded[name] = self.ops.record(stream)
        self.ops.join()
        output = next(n for n in self.graph.graph.nodes if n.op == "output")
        return torch.fx.node.map_arg(output.args[0], lambda n: values[n.name])


def on_streams(model: nn.Module, example: Any, streams: int, **options) -> nn.Module:
    """`model` on `streams` streams (Streamed, with `options`) where torch.fx traces it; else
    `model` itself, on one stream, with a UcudnnWarning naming fx's reason."""
    try:
        return Streamed(model, example, streams, **options)
    except ConfigError as exc:
        say_once(f"ucudnn: {exc}")
        return model


def _bind(graph: torch.fx.GraphModule, args: tuple) -> dict[str, Any]:
    """The values of the graph's placeholders (from `args`) and attributes."""
    values: dict[str, Any] = {}
    placeholders = iter(args)
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            values[node.name] = next(placeholders, node.args[0] if node.args else None)
        elif node.op == "get_attr":
            values[node.name] = _attribute(graph, node.target)
    return values


def _values(graph: torch.fx.GraphModule, args: tuple) -> dict[str, Any]:
    """Every node's value in one run of the graph on `args`, in graph order."""
    values = _bind(graph, args)
    for node in graph.graph.nodes:
        if node.op in COMPUTE:
            values[node.name] = _call(graph, node, values)()
    return values


def _call(graph: torch.fx.GraphModule, node: torch.fx.Node, values: Mapping[str, Any]) -> Callable[[], Any]:
    """The node's computation on the `values` of its inputs, as torch.fx.Interpreter runs it."""
    args = torch.fx.node.map_arg(node.args, lambda n: values[n.name])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: values[n.name])
    target = node.target  # a name (call_module, call_method), or call_function's function
    if isinstance(target, str):
        if node.op == "call_module":
            module = graph.get_submodule(target)
            return lambda: module(*args, **kwargs)
        return lambda: getattr(args[0], target)(*args[1:], **kwargs)
    return lambda: target(*args, **kwargs)


def _attribute(graph: torch.fx.GraphModule, target: str) -> Any:
    value: Any = graph
    for part in target.split("."):
        value = getattr(value, part)
    return value
