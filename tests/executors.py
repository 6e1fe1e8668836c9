"""What the CPU tests run dispatch with: fakes of both backends over a fake device memory, routed
and composed by the real ucudnn.execute.backends.Backends.

`FakeMemory` is one flat byte array whose addresses are byte offsets. A `MemoryBackend` runs each
plan with the float64 reference on the memory at those addresses, as a backend whose calls blend
(legacy: the route's alpha and beta applied) or not (engines: out = conv, and a blend asked of it
fails). Each plan first fills its own workspace with NaN, so that a layout in which a plan's
workspace overlaps a buffer that must survive (the accumulator of a sum) fails the test.
Combine steps run in NumPy: float32 arithmetic for half and float32 data, float64 for float64."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ucudnn.core.accumulation import Combine, buffer_type, output_elements
from ucudnn.core.problem import ConvProblem
from ucudnn.core.staging import SLICE_ALIGNMENT
from ucudnn.execute.backends import Backends, backend_of
from ucudnn.execute.dispatch import OUTPUT, Plan, Step, compile_program, steps
from ucudnn.optimizers.configuration import Configuration

import reference
from fakes import BLENDS, FakeBackend


def plan_workspace(step: Step) -> int:
    """The fake plans' own workspace: a few bytes per sample, more for some candidates."""
    return (64 + 32 * (sum(map(ord, step.algo)) % 3)) * step.problem.batch


class FakeMemory:
    """Device memory as one growing byte array; an address is a byte offset into it."""

    def __init__(self):
        self.data = np.zeros(256, np.uint8)

    def alloc(self, nbytes: int) -> int:
        address = -(-len(self.data) // 256) * 256
        self.data = np.concatenate([self.data, np.full(address - len(self.data) + max(nbytes, 1), 0xFF, np.uint8)])
        return address

    def place(self, array: np.ndarray) -> int:
        address = self.alloc(array.nbytes)
        self.view(address, array.size, array.dtype.name)[...] = array
        return address

    def view(self, address: int, count: int, dtype: str) -> np.ndarray:
        itemsize = np.dtype(dtype).itemsize
        return self.data[address:address + count * itemsize].view(dtype)


class MemoryBackend(FakeBackend):
    """One backend's plans on FakeMemory; `steps` lists the steps it prepared."""

    def __init__(self, name: str, memory: FakeMemory, workspace: Callable[[Step], int] = plan_workspace):
        super().__init__(name)
        self.memory, self.workspace = memory, workspace
        self.steps: list[Step] = []

    def prepare(self, step: Step) -> Plan:
        self.steps.append(step)
        return Plan(functools.partial(self._run, step), self.workspace(step))

    def _run(self, step: Step, x: int, w: int, y: int, out: int, workspace: int, workspace_size: int) -> None:
        p, r = step.problem, step.route
        for name, address in {"x": x, "y": y, "out": out}.items():  # FakeMemory allocates 256-aligned
            if address % SLICE_ALIGNMENT:
                raise AssertionError(f"part {step.part} ({step.algo}) was given {name} at {address}, off the "
                                     f"{SLICE_ALIGNMENT}-byte alignment its plan was measured at")
        self.memory.view(workspace, self.workspace(step), "uint8")[...] = 0xFF  # NaN in every float type
        shapes = {"x": p.x_shape, "w": p.w_shape, "y": p.y_shape}
        addresses = {"x": x, "w": w, "y": y}
        addresses[OUTPUT[p.kind]] = out
        logical = {role: reference.to_logical(self.memory.view(addresses[role], int(np.prod(shape)), p.dtype)
                                              .reshape(reference.stored_shape(shape, p.layout)), p.layout)
                   for role, shape in shapes.items()}
        result = reference.convolve(p, logical["x"], logical["w"], logical["y"])
        if not self.blends and (r.alpha, r.beta) != (1.0, 0.0):
            raise AssertionError(f"{self.name} cannot blend, but was routed {r}")
        if r.alpha != 1.0 or r.beta != 0.0:
            prior = logical[OUTPUT[p.kind]].astype(np.float64)
            result = r.alpha * result + (r.beta * prior if r.beta else 0.0)
        stored = reference.from_logical(result, p.layout).ravel()
        self.memory.view(out, stored.size, p.dtype)[...] = stored.astype(p.dtype)


def numpy_combine(memory: FakeMemory, problem: ConvProblem, c: Combine, buffers: dict, stream: int) -> None:
    count = output_elements(problem)
    src = memory.view(buffers[c.src], count, buffer_type(c.src, problem))
    dst = memory.view(buffers[c.dst], count, buffer_type(c.dst, problem))
    wide = np.float64 if "float64" in (src.dtype.name, dst.dtype.name) else np.float32
    acc = wide(c.alpha) * src.astype(wide)
    if c.beta != 0.0:
        acc = acc + wide(c.beta) * dst.astype(wide)
    dst[...] = acc.astype(dst.dtype)


def numpy_copy(memory: FakeMemory, dst: int, src: int, nbytes: int, stream: int) -> None:
    memory.data[dst:dst + nbytes] = memory.data[src:src + nbytes]


def fake_backends(memory: FakeMemory, workspace: Callable[[Step], int] = plan_workspace) -> Backends:
    """The real router over a fake legacy and a fake engines backend on `memory`."""
    return Backends([MemoryBackend(name, memory, workspace) for name in BLENDS],
                    combine=functools.partial(numpy_combine, memory), alloc=memory.alloc,
                    copy=functools.partial(numpy_copy, memory))


def footprint(problem: ConvProblem, configuration: Configuration, alpha: float = 1.0, beta: float = 0.0,
              workspace: Callable[[Step], int] = plan_workspace) -> int:
    """The workspace the fakes need to run `configuration`: what its measurements would say."""
    blends = lambda algo: BLENDS[backend_of(algo)]  # noqa: E731
    return max(s.buffer_bytes + workspace(s) for s in steps(problem, configuration, blends, alpha, beta))


def dispatch(problem: ConvProblem, configuration: Configuration, x: np.ndarray, w: np.ndarray, y: np.ndarray,
             alpha: float = 1.0, beta: float = 0.0, workspace_size: int | None = None) -> Backends:
    """Run `configuration` on flat arrays x, w, y (packed in the problem's layout) through the
    fakes, the results written back into them; the router, whose backends list the steps run."""
    memory = FakeMemory()
    backends = fake_backends(memory)
    addresses = [memory.place(a) for a in (x, w, y)]
    size = footprint(problem, configuration, alpha, beta) if workspace_size is None else workspace_size
    workspace = memory.alloc(size)  # NaN to start with: nothing may read it before writing it
    compile_program(problem, configuration, backends, alpha, beta)(*addresses, workspace, size)
    for array, address in zip((x, w, y), addresses):
        array[...] = memory.view(address, array.size, array.dtype.name)
    return backends


def steps_run(backends: Backends) -> list[Step]:
    """The steps the fakes of `backends` ran, in order."""
    return sorted((s for b in backends.by_name.values() for s in b.steps), key=lambda s: s.part)


def array_program(problem: ConvProblem, configuration: Configuration, alpha: float = 1.0, beta: float = 0.0,
                  ran: list | None = None):
    """The program of `configuration` on flat NumPy arrays rather than addresses (the workspace
    it is given is ignored: the fakes have their own); the steps of each run are added to `ran`."""
    def run(x: np.ndarray, w: np.ndarray, y: np.ndarray, workspace=None, workspace_size: int = 0) -> None:
        steps = steps_run(dispatch(problem, configuration, x, w, y, alpha, beta))
        if ran is not None:
            ran.extend(steps)

    return run
