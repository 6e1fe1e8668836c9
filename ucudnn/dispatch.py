"""Run a configuration: one call per micro-batch, operands offset along N.

The steps (which samples, which byte offsets, where each call writes and what follows it) are pure
and shared by every executor: the backends on the GPU (ucudnn.backends) and the NumPy fakes the CPU
tests check them with (tests/executors.py). `compose` turns a backend's plan of one step into the
step's whole call, the same way for every backend (ucudnn.accumulation).
Operands are named after the forward convolution: x (input), w (filter), y (output). F reads x
and w and writes y; BD reads y (dy) and w and writes x (dx); BF reads x and y (dy) and writes w (dw).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from . import accumulation
from .accumulation import Combine, Route
from .errors import CandidateError, ConfigError
from .optimizers.configuration import Configuration
from .problem import ConvKind, ConvProblem

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

    @property
    def accumulates(self) -> bool:
        """Whether this is a backward-filter call of several: each adds its samples' share to dw."""
        return self.problem.kind is ConvKind.BACKWARD_FILTER and self.parts > 1


Blends = Callable[[str], bool]  # candidate id -> whether its backend's calls take alpha and beta


def step(kernel: ConvProblem, algo: str, first_sample: int, batch: int, part: int, parts: int,
         alpha: float, beta: float, blends: Blends) -> Step:
    """Part `part` of `parts`: `batch` samples of `kernel` from `first_sample` on, run by `algo`."""
    micro = kernel.with_batch(batch)
    return Step(problem=micro, algo=algo, first_sample=first_sample,
                x_offset=first_sample * kernel.sample_bytes("x"), y_offset=first_sample * kernel.sample_bytes("y"),
                alpha=alpha, beta=beta, part=part, parts=parts,
                route=accumulation.route(micro, part, parts, alpha, beta, blends(algo)))


def steps(problem: ConvProblem, configuration: Configuration, blends: Blends, alpha: float = 1.0,
          beta: float = 0.0) -> list[Step]:
    """The calls that run `configuration` on `problem`. F and BD apply alpha and beta to each
    slice of their output; BF sums its parts into the whole dw (ucudnn.accumulation)."""
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


Call = Callable[[Any, Any, Any, Any, int], None]  # (x, w, y, workspace, workspace_size)


@dataclass(frozen=True)
class Plan:
    """A backend's call of one step's plan: run(x, w, y, out, workspace, workspace_size) on the
    addresses of the step's slices, writing `out` in place of the output operand with the route's
    alpha and beta; `workspace` is the bytes of its own workspace it needs."""

    run: Callable[[int, int, int, int, int, int], None]
    workspace: int


Combiner = Callable[[ConvProblem, Combine, dict], None]  # (micro kernel, combine, buffer addresses)


def compose(step: Step, plan: Plan, combine: Combiner, scratch: Callable[[int], int]) -> Call:
    """The whole call of `step` on operand addresses: its plan, then its route's Combine steps
    (run by `combine`; `scratch(nbytes)` gives the address of a buffer of the call's own). A
    workspace smaller than the route's buffers and the plan's workspace is refused, never overrun."""
    r, p = step.route, step.problem
    needs, out = r.buffer_bytes + plan.workspace, "xwy".index(OUTPUT[p.kind])
    run, combines, xo, yo = plan.run, r.combines, step.x_offset, step.y_offset

    def check(workspace_size: int) -> None:
        if workspace_size < needs:
            raise CandidateError(
                f"{step.algo} on {p.describe()} needs {needs} bytes of workspace ({r.buffer_bytes} of "
                f"buffers, {plan.workspace} of its own) but was given {workspace_size}: its measurement "
                "understates it; re-measure the kernel (ucudnn bench) with this ucudnn")

    if r.target == "output" and not combines:  # most calls: the plan writes the output itself
        def call(x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
            check(workspace_size)
            operands = (x + xo, w, y + yo)
            run(*operands, operands[out], workspace, workspace_size)

        return call
    own = []  # the scratch buffer's address, made on first use

    def call(x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
        check(workspace_size)
        operands = (x + xo, w, y + yo)
        buffers = {"output": operands[out], "accumulator": workspace, "partial": workspace + r.partial_offset}
        if r.target == "scratch":
            if not own:
                own.append(scratch(accumulation.output_elements(p) * p.itemsize))
            buffers["scratch"] = own[0]
        run(*operands, buffers[r.target], workspace + r.buffer_bytes, workspace_size - r.buffer_bytes)
        for c in combines:
            combine(p, c, buffers)

    return call


class Executor(Protocol):
    def blends(self, algo: str) -> bool:
        """Whether the calls of candidate `algo` take alpha and beta (ucudnn.accumulation)."""

    def prepare(self, step: Step) -> Call:
        """A call that runs `step` on operands x, w, y (device addresses, or the executor's own
        kind). Preparing once and calling many times keeps per-call host work small."""


class Program:
    """A configuration compiled for one executor: its calls, in order, ready to run many times."""

    def __init__(self, calls: list[Call]):
        self.calls = tuple(calls)

    def __call__(self, x: Any, w: Any, y: Any, workspace: Any = 0, workspace_size: int = 0) -> None:
        for call in self.calls:
            call(x, w, y, workspace, workspace_size)


def compile_program(problem: ConvProblem, configuration: Configuration, executor: Executor,
                    alpha: float = 1.0, beta: float = 0.0) -> Program:
    return Program([executor.prepare(s) for s in steps(problem, configuration, executor.blends, alpha, beta)])
