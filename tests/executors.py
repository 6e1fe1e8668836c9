"""What the tests run dispatch programs with: `dispatch` (compile and run once) and, for the CPU
tests, a NumPy executor over the float64 reference that honours byte offsets exactly as the
cuDNN executor does with pointers."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ucudnn import reference
from ucudnn.dispatch import Call, Executor, Step, compile_program
from ucudnn.optimizers.configuration import Configuration
from ucudnn.problem import ConvKind, ConvProblem


def dispatch(problem: ConvProblem, configuration: Configuration, executor: Executor, x: Any, w: Any,
             y: Any, alpha: float = 1.0, beta: float = 0.0, workspace: Any = None,
             workspace_size: int = 0) -> None:
    compile_program(problem, configuration, executor, alpha, beta)(x, w, y, workspace, workspace_size)


class NumpyExecutor:
    """Runs steps on flat NumPy arrays with the float64 reference, honouring byte offsets exactly
    as the cuDNN executor does with pointers. Records the steps it ran."""

    def __init__(self):
        self.steps: list[Step] = []

    def prepare(self, step: Step) -> Call:
        return functools.partial(self, step)

    def __call__(self, step: Step, x: np.ndarray, w: np.ndarray, y: np.ndarray, workspace=None,
                 workspace_size: int = 0) -> None:
        self.steps.append(step)
        p = step.problem
        views = {
            "x": self._view(x, step.x_offset, p.x_shape, p),
            "y": self._view(y, step.y_offset, p.y_shape, p),
            "w": self._view(w, 0, p.w_shape, p),
        }
        out = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}[p.kind]
        logical = {k: reference.to_logical(v, p.layout) for k, v in views.items()}
        result = reference.convolve(p, logical["x"], logical["w"], logical["y"])
        prior = logical[out].astype(np.float64)
        blended = step.alpha * result + (step.call_beta * prior if step.call_beta else 0.0)
        views[out][...] = reference.from_logical(blended, p.layout)

    @staticmethod
    def _view(flat: np.ndarray, offset: int, shape: tuple[int, ...], p: ConvProblem) -> np.ndarray:
        start = offset // flat.itemsize
        count = int(np.prod(shape))
        return flat[start:start + count].reshape(reference.stored_shape(shape, p.layout))
