"""Run a configuration: one call per micro-batch, operands offset along N.

The steps (which samples, which byte offsets, where each call writes and what follows it, which
slices are staged) are pure and shared by every executor: the backends on the GPU
(ucudnn.execute.backends) and the NumPy fakes the CPU tests check them with (tests/executors.py).
`compose` turns a backend's plan of one step into the step's whole call, the same way for every
backend (ucudnn.core.accumulation, ucudnn.core.staging).
Operands are named after the forward convolution: x (input), w (filter), y (output). F reads x
and w and writes y; BD reads y (dy) and w and writes x (dx); BF reads x and y (dy) and writes w (dw).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core import accumulation
from ..core.accumulation import Combine, Route
from ..core.errors import CandidateError, ConfigError
from ..core.problem import ConvKind, ConvProblem
from ..core.staging import SLICE_ALIGNMENT, is_aligned, slices_of
from ..optimizers.configuration import Configuration

OUTPUT = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}


@dataclass(frozen=True)
class Step:
    """One call: candidate `algo` (e.g. 'legacy:FFT') on samples [first_sample,
    first_sample + problem.batch), part `part` of the `parts` calls of a configuration, written as
    `route` says."""

    problem: ConvProblem  # the micro-batch kernel
    algo: str
    first_sample: int
    x_offset: int  # bytes from the start of x (dx for BD)
    y_offset: int  # bytes from the start of y (dy for BD and BF)
    alpha: float
    beta: float  # the caller's
    route: Route
    part: int = 0
    parts: int = 1
    staged: tuple[str, ...] = ()  # the slices (of "x", "y") run through the workspace (ucudnn.core.staging)

    @property
    def accumulates(self) -> bool:
        """Whether this is a backward-filter call of several: each adds its samples' share to dw."""
        return self.problem.kind is ConvKind.BACKWARD_FILTER and self.parts > 1

    def staging_offsets(self) -> dict[str, int]:
        """Where each staged slice lies in the workspace: after the route's buffers."""
        slices, offsets, at = slices_of(self.problem), {}, self.route.buffer_bytes
        for t in self.staged:
            offsets[t] = at
            at += slices.bytes(t, self.problem.batch)
        return offsets

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the workspace before the plan's own: the route's buffers and the staged slices."""
        slices = slices_of(self.problem)
        return self.route.buffer_bytes + sum(slices.bytes(t, self.problem.batch) for t in self.staged)


Blends = Callable[[str], bool]  # candidate id -> whether its backend's calls take alpha and beta


def step(kernel: ConvProblem, algo: str, first_sample: int, batch: int, part: int, parts: int,
         alpha: float, beta: float, blends: Blends) -> Step:
    """Part `part` of `parts`: `batch` samples of `kernel` from `first_sample` on, run by `algo`."""
    micro = kernel.with_batch(batch)
    return Step(problem=micro, algo=algo, first_sample=first_sample,
                x_offset=first_sample * kernel.sample_bytes("x"), y_offset=first_sample * kernel.sample_bytes("y"),
                alpha=alpha, beta=beta, part=part, parts=parts,
                route=accumulation.route(micro, part, parts, alpha, beta, blends(algo)),
                staged=slices_of(kernel).staged(first_sample))


def steps(problem: ConvProblem, configuration: Configuration, blends: Blends, alpha: float = 1.0,
          beta: float = 0.0) -> list[Step]:
    """The calls that run `configuration` on `problem`. F and BD apply alpha and beta to each
    slice of their output; BF sums its parts into the whole dw (ucudnn.core.accumulation)."""
    if configuration.batch != problem.batch:
        raise ConfigError(
            f"configuration covers {configuration.batch} samples but the kernel has batch "
            f"{problem.batch}; optimize it for this batch size"
        )
    found, first, parts = [], 0, len(configuration.micro)
    for i, part in enumerate(configuration.micro):
        found.append(step(problem, part.algo, first, part.batch, i, parts, alpha, beta, blends))
        first += part.batch
    return found


StepRun = Callable[[Any, Any, Any, Any, int], None]  # (x, w, y, workspace, workspace_size)


@dataclass(frozen=True)
class Plan:
    """A backend's call of one step's plan: run(x, w, y, out, workspace, workspace_size) on the
    addresses of the step's slices, writing `out` in place of the output operand with the route's
    alpha and beta; `workspace` is the bytes of its own workspace it needs."""

    run: Callable[[int, int, int, int, int, int], None]
    workspace: int


Combiner = Callable[[ConvProblem, Combine, dict], None]  # (micro kernel, combine, buffer addresses)
Copier = Callable[[int, int, int], None]  # (destination, source, bytes)


def compose(step: Step, plan: Plan, combine: Combiner, scratch: Callable[[int], int], copy: Copier) -> StepRun:
    """The whole call of `step` on operand addresses: its staged slices copied in, its plan, its
    route's Combine steps (run by `combine`; `scratch(nbytes)` gives the address of a buffer of
    the call's own), its staged output copied out (`copy`). A workspace smaller than the step's
    buffers and the plan's workspace is refused, never overrun; so are operands of a divided
    kernel that do not start at SLICE_ALIGNMENT, whose slices would not be where they were planned."""
    r, p = step.route, step.problem
    ahead, out = step.buffer_bytes, OUTPUT[p.kind]
    run, combines, xo, yo = plan.run, r.combines, step.x_offset, step.y_offset
    check = _checker(step, ahead + plan.workspace)
    if r.target == "output" and not combines and not step.staged:  # most calls: the plan writes the output itself
        written = "xwy".index(out)

        def in_place(x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
            check(x, y, workspace_size)
            operands = (x + xo, w, y + yo)
            run(*operands, operands[written], workspace, workspace_size)

        return in_place
    own: list[int] = []  # the scratch buffer's address, made on first use
    staging = step.staging_offsets()
    copied_in = [t for t in step.staged if t != out or _reads_output(r)]
    sizes = {t: p.sample_bytes(t) * p.batch for t in step.staged}

    def call(x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
        check(x, y, workspace_size)
        sliced = {"x": x + xo, "y": y + yo}
        operands = {**sliced, "w": w, **{t: workspace + at for t, at in staging.items()}}
        for t in copied_in:
            copy(operands[t], sliced[t], sizes[t])
        buffers = {"output": operands[out], "accumulator": workspace, "partial": workspace + r.partial_offset}
        if r.target == "scratch":
            if not own:
                own.append(scratch(accumulation.output_elements(p) * p.itemsize))
            buffers["scratch"] = own[0]
        run(operands["x"], w, operands["y"], buffers[r.target], workspace + ahead, workspace_size - ahead)
        for c in combines:
            combine(p, c, buffers)
        if out in staging:
            copy(sliced[out], operands[out], sizes[out])

    return call


def _reads_output(r: Route) -> bool:
    """Whether a call routed `r` reads the output it writes (blends with beta != 0)."""
    return (r.target == "output" and r.beta != 0.0) or any(c.dst == "output" and c.beta != 0.0 for c in r.combines)


def _checker(step: Step, needs: int) -> Callable[[int, int, int], None]:
    """The check before a call of `step` (see compose)."""
    divided, p = step.parts > 1, step.problem

    def check(x: int, y: int, workspace_size: int) -> None:
        if workspace_size < needs:
            raise CandidateError(
                f"{step.algo} on {p.describe()} needs {needs} bytes of workspace ({step.buffer_bytes} of "
                f"buffers and staged slices, {needs - step.buffer_bytes} of its own) but was given "
                f"{workspace_size}: its measurement understates it; re-measure the kernel (ucudnn bench) with this ucudnn")
        if divided and not (is_aligned(x) and is_aligned(y)):
            raise ConfigError(
                f"x at {x:#x} and y at {y:#x}: a micro-batched kernel needs both to start at a multiple of "
                f"{SLICE_ALIGNMENT} bytes, as allocations do; pass tensors that own their memory (a copy)")

    return check


class Executor(Protocol):
    def blends(self, algo: str) -> bool:
        """Whether the calls of candidate `algo` take alpha and beta (ucudnn.core.accumulation)."""

    def prepare(self, step: Step) -> StepRun:
        """A call that runs `step` on operands x, w, y (device addresses, or the executor's own
        kind). Preparing once and calling many times keeps per-call host work small."""


class Program:
    """A configuration compiled for one executor: its calls, in order, ready to run many times."""

    def __init__(self, calls: list[StepRun]):
        self.calls = tuple(calls)

    def __call__(self, x: Any, w: Any, y: Any, workspace: Any = 0, workspace_size: int = 0) -> None:
        for call in self.calls:
            call(x, w, y, workspace, workspace_size)


def compile_program(problem: ConvProblem, configuration: Configuration, executor: Executor,
                    alpha: float = 1.0, beta: float = 0.0) -> Program:
    return Program([executor.prepare(s) for s in steps(problem, configuration, executor.blends, alpha, beta)])
