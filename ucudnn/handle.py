"""ucudnn.Handle: a drop-in for a cuDNN handle that runs every convolution micro-batched.

Frameworks ask for an algorithm and a workspace size, then convolve. With a ucudnn handle the
query answers a virtual algorithm and zero workspace, and the convolution runs the kernel's
optimized configuration (see ucudnn.plan.assignment) in the handle's own workspace, on the handle's stream:
replayed as a CUDA graph (ucudnn.execute.graphs) unless the execution setting is `direct`.
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .core.errors import NoAlgorithmError
from .core.measurements import OK
from .core.problem import ConvProblem
from .execute import gpu
from .execute.backends import Candidate, open_backends
from .execute.bindings import cudnn
from .execute.bindings.cudnn import Pointer
from .execute.bindings.enums import VIRTUAL_ALGO
from .execute.dispatch import compile_program
from .execute.gpu import Buffer
from .execute.graphs import GraphCapturer, GraphedProgram
from .measure.benchmark import Benchmarker, ConfigurationTimer, CudnnBenchmarker
from .optimizers.configuration import Configuration, MicroConfig
from .optimizers.wd import WDResult
from .plan.assignment import NO_MEMORY, Assignment, Assignments, Shrink
from .plan.config import Settings

if TYPE_CHECKING:
    from .measure.cache import Cache


class Handle:
    """Wraps a cuDNN handle. Pass it wherever ucudnn.cudnn takes a handle; passed to a raw
    ctypes cuDNN call it acts as the cuDNN handle it wraps.

    Settings come from keyword arguments, then UCUDNN_* variables (see ucudnn.plan.config.Settings).
    `allocator(nbytes)` returns an object holding device memory (default: CuPy's pool).
    `cudnn_handle`: a cuDNN handle to run on (else one of its own, destroyed by close()); its
    owner may move it to other streams, so every direct call sets it to this handle's stream
    first (graph replays do not use it).
    `make_room()`: gives device memory back where a CUDA graph, the handle's or its benchmarker's,
    finds none (a framework's allocator cache, e.g. torch.cuda.empty_cache)."""

    def __init__(self, settings: Settings | None = None, *, cache: Cache | None = None,
                 benchmarker: Benchmarker | None = None, allocator: Callable[[int], Any] | None = None,
                 cudnn_handle: Pointer | None = None, stream: int | None = None,
                 make_room: Callable[[], None] | None = None, **settings_kwargs: Any) -> None:
        from .measure.cache import Cache

        self.settings = settings or Settings.load(**settings_kwargs)
        self._owns_handle = cudnn_handle is None
        self.cudnn_handle: Pointer = cudnn.create_handle() if cudnn_handle is None else cudnn_handle
        self._as_parameter_: Pointer = self.cudnn_handle  # what ctypes passes for the Handle; None once closed
        self.stream = gpu.current_stream() if stream is None else stream
        self.backends = open_backends(self.settings.backend, self.cudnn_handle, self.stream)
        self.assignments = Assignments(
            self.settings, cache if cache is not None else Cache(self.settings.cache_path),
            benchmarker=lambda: benchmarker or CudnnBenchmarker(self.cudnn_handle, stream=self.stream,
                                                                execution=self.settings.execution,
                                                                backend=self.settings.backend,
                                                                make_room=make_room),
            allocator=allocator or gpu.alloc, pointer=gpu.pointer,
        )
        self._programs: dict[tuple[ConvProblem, float, float], Callable[[int, int, int], None]] = {}
        self._capturer = (GraphCapturer(self.backends.set_stream, lambda: self.stream, make_room)
                          if self.settings.execution == "graph" else None)
        self._make_room = make_room
        self._timer: ConfigurationTimer | None = None  # favourite_ms's, made on first use

    def set_stream(self, stream: int) -> None:
        """Later convolutions run on `stream` (a cudaStream_t address)."""
        self.stream = stream
        self.backends.set_stream(stream)

    def query(self, problem: ConvProblem) -> tuple[int, int]:
        """(algorithm, workspace bytes) to report for an algorithm query: virtual and zero."""
        self.assignments.record(problem)
        return VIRTUAL_ALGO, 0

    def convolve(self, problem: ConvProblem, x: Buffer, w: Buffer, y: Buffer, alpha: float = 1.0,
                 beta: float = 0.0) -> None:
        """Run `problem` micro-batched on device buffers x, w, y (addresses, CuPy or torch arrays).
        F reads x, w and writes y; BD reads y (dy), w and writes x (dx); BF reads x, y and writes w."""
        run = self._programs.get((problem, alpha, beta)) or self._compile(problem, alpha, beta)
        run(gpu.pointer(x), gpu.pointer(w), gpu.pointer(y))

    def _compile(self, problem: ConvProblem, alpha: float, beta: float) -> Callable[[int, int, int], None]:
        """The kernel's plan compiled once into cuDNN calls, so that a convolution costs little
        more host time than cuDNN's own (it matters for kernels of tens of microseconds)."""
        kernel = self.assignments.get(problem)
        program = self.program(problem, kernel.configuration, alpha, beta)
        run = functools.partial(_run, program, kernel.workspace, kernel.workspace_size)
        self._programs[problem, alpha, beta] = run
        return run

    def program(self, problem: ConvProblem, configuration: Configuration, alpha: float = 1.0,
                beta: float = 0.0) -> Callable[[int, int, int, int, int], None]:
        """`configuration` compiled for this handle: run(x, w, y, workspace, workspace_size)
        on device addresses, as the execution setting says (graph: see ucudnn.execute.graphs)."""
        program = compile_program(problem, configuration, self.backends, alpha, beta)
        # a lent handle's owner (torch, a framework) sets it to the stream of each of its own
        # calls, which may not be ours: direct runs set it back first (captures redirect it anyway)
        direct = program if self._owns_handle else functools.partial(_on_stream, self, program)
        if self._capturer is None:
            return direct
        return GraphedProgram(program, self._capturer, problem.describe(), direct=direct)

    def favourite(self, problem: ConvProblem) -> Candidate:
        """cuDNN's heuristic favourite for `problem`: the first-ranked candidate of the first
        backend in use, with its workspace; nothing is timed."""
        backend = self.backends[self.backends.names[0]]
        try:
            return backend.candidate(problem, backend.ranked(problem)[0])
        finally:
            backend.release()

    def heuristic(self, problem: ConvProblem, limit: int) -> Assignment:
        """`problem` undivided on cuDNN's heuristic favourite among the candidates whose workspace
        fits `limit` bytes (zero workspace at worst), its workspace borrowed at each call: what
        runs where memory has run out, with nothing timed or allocated to choose it.
        NoAlgorithmError where no candidate of the backends in use fits."""
        for name in self.backends.names:
            backend = self.backends[name]
            try:
                for candidate in (backend.candidate(problem, c) for c in backend.ranked(problem)):  # lazily
                    if candidate.status == OK and candidate.workspace <= limit:
                        micro = MicroConfig(candidate.id, problem.batch, math.nan, candidate.workspace)
                        return Assignment(Configuration((micro,)), 0, candidate.workspace)
            finally:
                backend.release()
        raise NoAlgorithmError(f"no cuDNN candidate of {problem.describe()} runs within {limit} bytes of workspace; "
                               "free device memory")

    def favourite_ms(self, problem: ConvProblem) -> float:
        """cuDNN's favourite (favourite()) on the whole batch, run as this handle runs a kernel
        and timed (median ms) on operands of its own, which are given back afterwards; inf where
        it cannot run (unsupported, or its operands or workspace cannot be had): failures are data."""
        favourite = self.favourite(problem)
        if favourite.status != OK:
            return math.inf
        configuration = Configuration((MicroConfig(favourite.id, problem.batch, math.nan, favourite.workspace),))
        try:
            if self._timer is None:
                self._timer = ConfigurationTimer(self.cudnn_handle, stream=self.stream, execution=self.settings.execution,
                                                 backend=self.settings.backend, make_room=self._make_room)
            return self._timer.time_ms(problem, configuration)
        except Exception:  # noqa: BLE001 - out of memory, or a plan that fails to build or run
            return math.inf
        finally:
            if self._timer is not None:
                self._timer.scratch.release()

    def assignment(self, problem: ConvProblem) -> Assignment:
        """The kernel's configuration and workspace, optimizing it (WD: solving) if needed."""
        return self.assignments.get(problem)

    def configuration(self, problem: ConvProblem) -> Configuration:
        return self.assignments.get(problem).configuration

    @property
    def wd_result(self) -> WDResult | None:
        """WD: the last solve's result (configurations, division, ILP size), else None."""
        return self.assignments.wd_result

    def __len__(self) -> int:
        """Kernels assigned so far."""
        return len(self.assignments)

    def finalize(self, total: int | None = None) -> None:
        """WD: the network is complete; solve it now rather than at the first convolution, within
        `total` bytes (default: the settings' total limit)."""
        self.assignments.finalize(total)

    def shrink(self, problem: ConvProblem, available: int | None = None, failed: Assignment | None = None,
               why: str = NO_MEMORY) -> Assignment:
        """Plan `problem` again within less workspace (the bytes `available`, or half): the caller
        could not allocate the workspace its assignment (or `failed`, a plan of within()) asked
        for, or only at the cost `why` says (see Assignments.shrink)."""
        if failed is None:
            self._programs = {key: run for key, run in self._programs.items() if key[0] != problem}
        return self.assignments.shrink(problem, available, failed, why)

    def within(self, problem: ConvProblem, limit: int) -> Assignment:
        """WR: `problem`'s plan within `limit` bytes, kept by the caller rather than this handle:
        a framework plans one kernel at several moments of its step (Assignments.within)."""
        return self.assignments.within(problem, limit)

    @property
    def wd_limit(self) -> int | None:
        """WD: the total the last solve was given (after any halving for lack of memory)."""
        return self.assignments.wd_limit

    @property
    def shrinks(self) -> list[Shrink]:
        """Each step down of a kernel's workspace (Assignments.shrinks), in order."""
        return self.assignments.shrinks

    @contextlib.contextmanager
    def network(self) -> Iterator[Handle]:
        """`with handle.network(): <queries for every layer>` solves WD on exit."""
        yield self
        self.assignments.finalize()

    def reset(self) -> None:
        """Assign every known kernel again on next use (WD: solving them as one network), after
        the handle's stream has finished with the old workspaces. Between iterations only."""
        gpu.cupy().cuda.runtime.streamSynchronize(self.stream)
        self._forget()

    def _forget(self) -> None:
        self._programs.clear()
        self.assignments.reset()

    def close(self) -> None:
        self._forget()
        self.backends.close()
        if self._timer is not None:  # favourite_ms's, on this handle's cuDNN handle
            self._timer.backends.close()
            self._timer = None
        if self._owns_handle and self.cudnn_handle is not None:
            cudnn.destroy_handle(self.cudnn_handle)
        self.cudnn_handle = self._as_parameter_ = None

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.settings
        return (f"ucudnn.Handle(optimizer={s.optimizer!r}, backends={self.backends.names}, policy={s.policy!r}, "
                f"workspace_limit={s.workspace_limit}, execution={s.execution!r}, kernels={len(self)})")


def _on_stream(handle: Handle, program: Callable[..., None], *operands: int) -> None:
    """Run `program` with the lent cuDNN handle set to `handle`'s stream."""
    cudnn.set_stream(handle.cudnn_handle, handle.stream)
    program(*operands)


def _run(program: Callable[..., None], workspace: int, workspace_size: int, x: int, w: int, y: int) -> None:
    program(x, w, y, workspace, workspace_size)
