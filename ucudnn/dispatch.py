"""Run a configuration: one call per micro-batch, operands offset along N.

The steps (which samples, which byte offsets, which alpha/beta) are pure and shared by every
executor: the backends on the GPU (ucudnn.backends) and the NumPy executor the CPU tests check
them with (tests/executors.py).
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
    """One call: candidate `algo` (e.g. 'legacy:FFT') on samples [first_sample,
    first_sample + problem.batch), part `part` of the `parts` calls of a configuration."""

    problem: ConvProblem  # the micro-batch kernel
    algo: str
    first_sample: int
    x_offset: int  # bytes from the start of x (dx for BD)
    y_offset: int  # bytes from the start of y (dy for BD and BF)
    alpha: float
    beta: float  # the caller's
    part: int = 0
    parts: int = 1

    @property
    def accumulates(self) -> bool:
        """Whether this is a backward-filter call of several: each adds its samples' share to dw."""
        return self.problem.kind is ConvKind.BACKWARD_FILTER and self.parts > 1

    @property
    def call_beta(self) -> float:
        """The beta of this call where a call takes alpha and beta (legacy cuDNN, NumPy): BF
        applies the caller's beta in its first call, then adds (beta = 1)."""
        return 1.0 if self.accumulates and self.part > 0 else self.beta


def steps(problem: ConvProblem, configuration: Configuration, alpha: float = 1.0,
         beta: float = 0.0) -> list[Step]:
    """The calls that run `configuration` on `problem`. F and BD apply alpha and beta to each
    slice of their output; BF accumulates into the whole dw (Step.call_beta)."""
    if configuration.batch != problem.batch:
        raise ConfigError(
            f"configuration covers {configuration.batch} samples but the kernel has batch "
            f"{problem.batch}; optimize it for this batch size"
        )
    steps, first, parts = [], 0, len(configuration.micro)
    for i, part in enumerate(configuration.micro):
        steps.append(Step(
            problem=problem.with_batch(part.batch), algo=part.algo, first_sample=first,
            x_offset=first * problem.sample_bytes("x"), y_offset=first * problem.sample_bytes("y"),
            alpha=alpha, beta=beta, part=i, parts=parts,
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
