"""Run a configuration: one cuDNN call per micro-batch, operands offset along N.

The steps (which samples, which byte offsets, which alpha/beta) are pure and shared by every
executor: the cuDNN executor on the GPU (bindings/executor.py) and the NumPy executor the CPU
tests check it with (tests/executors.py).
Operands are named after the forward convolution: x (input), w (filter), y (output). F reads x
and w and writes y; BD reads y (dy) and w and writes x (dx); BF reads x and y (dy) and writes w (dw).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .errors import ConfigError
from .optimizers.configuration import Configuration
from .problem import ConvKind, ConvProblem


@dataclass(frozen=True)
class Step:
    """One cuDNN call: algorithm `algo` on samples [first_sample, first_sample + problem.batch)."""

    problem: ConvProblem  # the micro-batch kernel
    algo: int
    first_sample: int
    x_offset: int  # bytes from the start of x (dx for BD)
    y_offset: int  # bytes from the start of y (dy for BD and BF)
    alpha: float
    beta: float


def steps(problem: ConvProblem, configuration: Configuration, alpha: float = 1.0,
         beta: float = 0.0) -> list[Step]:
    """The calls that run `configuration` on `problem`. F and BD apply alpha and beta to each
    slice of their output; BF accumulates into the whole dw: beta first, then 1."""
    if configuration.batch != problem.batch:
        raise ConfigError(
            f"configuration covers {configuration.batch} samples but the kernel has batch "
            f"{problem.batch}; optimize it for this batch size"
        )
    steps, first = [], 0
    for i, part in enumerate(configuration.micro):
        accumulate = problem.kind is ConvKind.BACKWARD_FILTER and i > 0
        steps.append(Step(
            problem=problem.with_batch(part.batch), algo=part.algo, first_sample=first,
            x_offset=first * problem.sample_bytes("x"), y_offset=first * problem.sample_bytes("y"),
            alpha=alpha, beta=1.0 if accumulate else beta,
        ))
        first += part.batch
    return steps


Call = Callable[[Any, Any, Any, Any, int], None]  # (x, w, y, workspace, workspace_size)


class Executor(Protocol):
    def prepare(self, step: Step) -> Call:
        """A call that runs `step` on operands x, w, y (device addresses, arrays: the executor's own
        kind). Preparing once and calling many times keeps per-call host work small."""


class Program:
    """A configuration compiled for one executor: its calls, in order, ready to run many times."""

    def __init__(self, calls: list[Call]):
        self.calls = tuple(calls)

    def __call__(self, x: Any, w: Any, y: Any, workspace: Any = None, workspace_size: int = 0) -> None:
        for call in self.calls:
            call(x, w, y, workspace, workspace_size)


def compile_program(problem: ConvProblem, configuration: Configuration, executor: Executor,
                 alpha: float = 1.0, beta: float = 0.0) -> Program:
    return Program([executor.prepare(step) for step in steps(problem, configuration, alpha, beta)])
