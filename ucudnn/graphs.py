"""Graph execution: a kernel's micro-batch calls replayed as one CUDA graph.

A legacy cuDNN call costs 50-100 µs of host time. A configuration of many small micro-batches
issues calls shorter than that, so run directly the GPU waits for the host and the kernel runs
slower than its measurements predict (docs/results.md, "Many small micro-batches are host-bound").
Captured into a graph, the calls cost one launch and run back to back at the GPU's pace.

A graph holds the device addresses it was captured with, so one is kept per set of operand and
workspace addresses. The first run with a set runs directly; the second captures a graph; later
ones replay it. Buffers that move every call (nothing reused) therefore cost nothing extra.

Pure logic over a capturer (ucudnn.gpu.GraphCapturer on the GPU; a fake in the CPU tests).
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Callable, Hashable, Protocol

from .errors import GraphCaptureError, UcudnnWarning

MAX_GRAPHS = 8  # per kernel: address sets in use at once (e.g. torch's caching allocator ping-pong)
MAX_SEEN = 32  # per kernel: address sets seen once, waiting for a second sight


class Capturer(Protocol):
    def capture(self, run: Callable[[], None]) -> Any:
        """A graph of the work run() queues (raises GraphCaptureError if it cannot be captured)."""

    def launch(self, graph: Any) -> None:
        """Queue one replay of `graph` on the caller's stream."""

    def capturing(self) -> bool:
        """Whether the caller's stream is being captured by the caller (then run directly)."""


class GraphedProgram:
    """Runs `program(x, w, y, workspace, workspace_size)` as described above; `kernel` names the
    kernel in the warning given if its calls cannot be captured (it then always runs directly)."""

    def __init__(self, program: Callable[..., None], capturer: Capturer, kernel: str = "kernel",
                 max_graphs: int = MAX_GRAPHS, max_seen: int = MAX_SEEN):
        self.program, self.capturer, self.kernel = program, capturer, kernel
        self.max_graphs, self.max_seen = max_graphs, max_seen
        self.graphs: OrderedDict[Hashable, Any] = OrderedDict()  # addresses -> graph, oldest first
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self.capture_failure: str | None = None
        self.direct_runs = self.captures = self.replays = 0

    def __call__(self, x: int, w: int, y: int, workspace: int = 0, workspace_size: int = 0) -> None:
        addresses = (x, w, y, workspace, workspace_size)
        graph = self.graphs.get(addresses)
        if graph is None and self._second_sight(addresses):
            graph = self._capture(addresses)
        if graph is None:
            self.direct_runs += 1
            self.program(*addresses)
            return
        self.graphs.move_to_end(addresses)
        self.replays += 1
        self.capturer.launch(graph)

    def _second_sight(self, addresses: Hashable) -> bool:
        if self.capture_failure is not None or self.capturer.capturing():
            return False
        if addresses in self._seen:
            del self._seen[addresses]
            return True
        self._seen[addresses] = None
        if len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        return False

    def _capture(self, addresses: tuple) -> Any:
        try:
            graph = self.capturer.capture(lambda: self.program(*addresses))
        except GraphCaptureError as exc:
            self.capture_failure = str(exc)
            warnings.warn(f"ucudnn: the calls of {self.kernel} cannot be captured into a CUDA graph "
                          f"({exc}); they run directly from now on, host-paced where micro-batches "
                          "are small. Set UCUDNN_EXECUTION=direct to plan for that from the start",
                          UcudnnWarning, stacklevel=4)
            return None
        self.captures += 1
        self.graphs[addresses] = graph
        if len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)  # the graph is freed once any replay in flight ends
        return graph
