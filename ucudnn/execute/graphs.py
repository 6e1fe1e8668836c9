"""Graph execution: a kernel's micro-batch calls replayed as one CUDA graph.

A legacy cuDNN call costs host time. A configuration of many small micro-batches
issues calls shorter than that, so run directly the GPU waits for the host and the kernel runs
slower than its measurements predict (docs/results.md, "Many small micro-batches are host-bound").
Captured into a graph, the calls cost one launch and run back to back at the GPU's pace.

A graph holds the device addresses it was captured with, so one is kept per set of operand and
workspace addresses. The first run with a set runs directly; the second captures a graph; later
ones replay it. Buffers that move every call (nothing reused) therefore cost nothing extra, and a
kernel whose graphs are rarely replayed stops capturing new ones (see CHURN_CAPTURES).

GraphedProgram is pure logic over a capturer: `GraphCapturer` (CUDA, through CuPy) on the GPU,
`cudnn_capturer(handle, stream)` for the calls of a cuDNN handle; a fake in the CPU tests.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ..core.errors import GraphCaptureError
from ..core.fallback import say_once
from .gpu import cupy

# per kernel: address sets in use at once. A kernel shared by several layers (ResNet-50's repeated
# blocks), each with its own tensors and borrowed workspace, cycles through more than 8 per
# iteration, and a kernel kept to fewer than it cycles through re-captures graphs every iteration
# (docs/results-archive.md, "PyTorch: delegating layers ucudnn would not speed up").
MAX_GRAPHS = 32
MAX_SEEN = 64  # per kernel: address sets seen once, waiting for a second sight
# A kernel whose address sets come back once and then never again (tensors the caching allocator
# places anew each iteration) would capture a graph, at a cost in host time, for each:
# after CHURN_CAPTURES captures with fewer than CHURN_REPLAYS launches per capture (the launch
# right after a capture counts), new address sets run directly until replays catch up. (ResNet-50
# in AMP with every layer converted has such kernels beside replayed ones: docs/results-archive.md,
# "PyTorch: delegating layers ucudnn would not speed up".)
CHURN_CAPTURES = MAX_GRAPHS
CHURN_REPLAYS = 2


class GraphMemory:
    """The device memory that instantiated graphs hold beside any allocator's pool, process-wide:
    the sum of each live graph's bytes as measured when it was instantiated (`held`). With a
    `budget`, a program captures no new graph once `held` reaches it (its calls run directly);
    `release()` gives every graph back. A framework sets the budget from the room its step leaves
    (ucudnn.plan.planner.Planner), and 0 once the device has run out of memory."""

    def __init__(self) -> None:
        self.budget: int | None = None  # None: unbounded
        self._programs: weakref.WeakSet = weakref.WeakSet()

    def track(self, program: GraphedProgram) -> None:
        self._programs.add(program)

    @property
    def held(self) -> int:
        return sum(p.graph_bytes for p in list(self._programs))

    def admits(self) -> bool:
        """Whether a new graph may be captured now."""
        return self.budget is None or self.held < self.budget

    def release(self) -> int:
        """Give back every graph of every program (each is freed once any replay in flight ends);
        the bytes they held."""
        held = self.held
        for program in list(self._programs):
            program.drop()
        return held


GRAPH_MEMORY = GraphMemory()


class Capturer(Protocol):
    def capture(self, run: Callable[[], None]) -> Any:
        """A graph of the work run() queues (raises GraphCaptureError if it cannot be captured)."""

    def launch(self, graph: Any) -> None:
        """Queue one replay of `graph` on the caller's stream."""

    def capturing(self) -> bool:
        """Whether the caller's stream is being captured by the caller (then run directly)."""


class GraphedProgram:
    """Runs `program(x, w, y, workspace, workspace_size)` as described above; `kernel` names the
    kernel in the warning given if its calls cannot be captured (it then always runs directly).
    `direct`: what runs instead of `program` where it runs directly (default: program)."""

    def __init__(self, program: Callable[..., None], capturer: Capturer, kernel: str = "kernel",
                 max_graphs: int = MAX_GRAPHS, max_seen: int = MAX_SEEN, direct: Callable[..., None] | None = None):
        self.program, self.capturer, self.kernel = program, capturer, kernel
        self.direct = direct or program
        self.max_graphs, self.max_seen = max_graphs, max_seen
        self.graphs: OrderedDict[Hashable, Any] = OrderedDict()  # addresses -> graph, oldest first
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self.capture_failure: str | None = None
        self.direct_runs = self.captures = self.replays = 0
        GRAPH_MEMORY.track(self)

    @property
    def graph_bytes(self) -> int:
        """The device bytes this program's graphs hold (GraphMemory): each graph's, as measured
        when it was instantiated."""
        return sum(getattr(graph, "nbytes", 0) for graph in self.graphs.values())

    def drop(self) -> None:
        """Forget every graph (freed once any replay in flight ends); the next sights capture anew."""
        self.graphs.clear()
        self._seen.clear()

    def __call__(self, x: int, w: int, y: int, workspace: int = 0, workspace_size: int = 0) -> None:
        """Where the caller's stream is being captured, its graph takes the calls themselves (a
        graph cannot be launched into a capturing stream): the caller that warms up on the
        operands it captures with finds a graph of ours for them already."""
        addresses = (x, w, y, workspace, workspace_size)
        graph = None if self.capturer.capturing() else self._graph(addresses)
        if graph is None:
            self.direct_runs += 1
            self.direct(*addresses)
            return
        self.graphs.move_to_end(addresses)
        self.replays += 1
        self.capturer.launch(graph)

    def _graph(self, addresses: tuple) -> Any:
        """The graph to launch for these addresses: the one kept, one captured now on their
        second sight while GRAPH_MEMORY admits one (summed only then: a capture costs far more),
        or None (run directly)."""
        graph = self.graphs.get(addresses)
        if graph is None and self._second_sight(addresses) and GRAPH_MEMORY.admits():
            graph = self._capture(addresses)
        return graph

    def _second_sight(self, addresses: Hashable) -> bool:
        if self.capture_failure is not None or self._churning():
            return False
        if addresses in self._seen:
            del self._seen[addresses]
            return True
        self._seen[addresses] = None
        if len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        return False

    def _churning(self) -> bool:
        """Whether captured graphs are rarely replayed: capturing more would cost more than it saves."""
        return self.captures >= CHURN_CAPTURES and self.replays < CHURN_REPLAYS * self.captures

    def _capture(self, addresses: tuple) -> Any:
        try:
            graph = self.capturer.capture(lambda: self.program(*addresses))
        except GraphCaptureError as exc:
            self.capture_failure = str(exc)
            say_once(f"ucudnn: the calls of {self.kernel} cannot be captured into a CUDA graph "
                     f"({exc}); they run directly from now on, host-paced where micro-batches "
                     "are small. Set UCUDNN_EXECUTION=direct to plan for that from the start")
            return None
        self.captures += 1
        self.graphs[addresses] = graph
        if len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)  # the graph is freed once any replay in flight ends
        return graph


# --- CUDA graphs through CuPy ----------------------------------------------------------------------

_CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal: other threads' CUDA calls stay legal
_OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation


class Graph:
    """An instantiated CUDA graph: the work captured once, replayed by one launch; `nbytes`, the
    device memory its instantiation took (the device's free bytes before less after)."""

    def __init__(self, executable: int, nbytes: int = 0):
        self._executable, self.nbytes = executable, nbytes
        self._destroy = cupy().cuda.runtime.graphExecDestroy

    def launch(self, stream: int) -> None:
        cupy().cuda.runtime.graphLaunch(self._executable, stream)

    def __del__(self):
        # safe while a launch is in flight: CUDA frees the graph when it completes
        self._destroy(self._executable)


class GraphCapturer:
    """Captures what a library queues on its stream into CUDA graphs, and launches them.

    Work is captured on a private stream (a caller's stream may be the legacy default stream,
    which cannot capture): `redirect(stream)` points the library at a stream (for cuDNN,
    cudnnSetStream on its handle) and `stream()` names the caller's stream, where graphs run.
    The private stream and an instantiated graph hold device memory outside any allocator's pool:
    where there is none, `make_room()` (e.g. torch.cuda.empty_cache) is called and the call is
    tried once more."""

    def __init__(self, redirect, stream, make_room: Callable[[], None] | None = None):
        self._redirect, self._stream, self._make_room = redirect, stream, make_room
        self._private = self._with_room(cupy().cuda.runtime.streamCreateWithFlags, 1)  # cudaStreamNonBlocking

    def capture(self, run) -> Graph:
        """A graph of the work `run()` queues; GraphCaptureError if any of it cannot be captured."""
        rt = cupy().cuda.runtime
        self._redirect(self._private)
        try:
            rt.streamBeginCapture(self._private, _CAPTURE_THREAD_LOCAL)
            try:
                run()
            except BaseException:
                with contextlib.suppress(Exception):
                    rt.graphDestroy(rt.streamEndCapture(self._private))
                raise
            graph = rt.streamEndCapture(self._private)  # raises if the capture was invalidated
            try:
                free = rt.memGetInfo()[0]
                executable = self._instantiate(graph)
                return Graph(executable, max(0, free - rt.memGetInfo()[0]))
            finally:
                rt.graphDestroy(graph)
        except Exception as exc:
            raise GraphCaptureError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._redirect(self._stream())

    def _instantiate(self, graph: int) -> int:
        return self._with_room(cupy().cuda.runtime.graphInstantiate, graph)

    def _with_room(self, call: Callable[..., int], *args) -> int:
        """call(*args), and where the device is out of memory, once more after make_room()."""
        rt = cupy().cuda.runtime
        try:
            return call(*args)
        except rt.CUDARuntimeError as exc:
            if self._make_room is None or exc.status != _OUT_OF_MEMORY:
                raise
        self._make_room()
        return call(*args)

    def launch(self, graph: Graph) -> None:
        graph.launch(self._stream())

    def capturing(self) -> bool:
        """Whether the caller's stream is itself being captured (its own graph takes our calls)."""
        stream = self._stream()
        return stream != 0 and cupy().cuda.runtime.streamIsCapturing(stream)

    def __del__(self):
        with contextlib.suppress(Exception):
            cupy().cuda.runtime.streamDestroy(self._private)


def cudnn_capturer(handle, stream: Callable[[], int]) -> GraphCapturer:
    """A GraphCapturer for the calls made on cuDNN `handle`; `stream()` is where graphs run."""
    from .bindings import cudnn

    return GraphCapturer(functools.partial(cudnn.set_stream, handle), stream)
