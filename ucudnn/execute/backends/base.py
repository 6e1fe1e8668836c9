"""What every backend shares: candidate ids, the Backend interface, the set a handle uses."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...core.errors import ConfigError, unknown
from ..dispatch import compose

if TYPE_CHECKING:
    from ...core.accumulation import Combine
    from ...core.problem import ConvProblem
    from ..dispatch import Plan, Step, StepRun

BACKENDS = ("legacy", "engines")
CHOICES = ("all", "engines", "legacy")
FRONTEND_PACKAGE = "nvidia-cudnn-frontend"


def candidate_id(backend: str, name: str) -> str:
    return f"{backend}:{name}"


def split_id(candidate: str) -> tuple[str, str]:
    """('legacy', 'FFT') from 'legacy:FFT'."""
    backend, sep, name = str(candidate).partition(":")
    if not sep or not backend or not name:
        raise ConfigError(f"candidate {candidate!r} is not named 'backend:name' (e.g. 'legacy:FFT_TILING')")
    return backend, name


def backend_of(candidate: str) -> str:
    return split_id(candidate)[0]


def frontend_installed() -> bool:
    """Whether nvidia-cudnn-frontend (module `cudnn`) can be imported here."""
    return importlib.util.find_spec("cudnn") is not None


def frontend_version() -> str:
    """The installed nvidia-cudnn-frontend's version, '' where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(FRONTEND_PACKAGE)
    except metadata.PackageNotFoundError:
        return ""


def resolve(choice: str, *, frontend: bool | None = None) -> tuple[str, ...]:
    """The backends a `backend` setting names. '' (not set) is `all` where the frontend is
    installed, else `legacy`; `frontend` overrides the check (offline, measurements of every
    backend can be used whatever is installed)."""
    if choice not in ("", *CHOICES):
        raise unknown(choice, CHOICES, "backend")
    if choice == "":
        choice = "all" if (frontend_installed() if frontend is None else frontend) else "legacy"
    return BACKENDS if choice == "all" else (choice,)


@dataclass(frozen=True)
class Candidate:
    """One way a backend can run a micro-batch kernel: its id, the bytes of workspace its plan
    needs (dispatch's buffers come on top: ucudnn.core.accumulation) and whether it can run
    (measurements.OK) or why not."""

    id: str
    workspace: int
    status: str


class Backend(Protocol):
    name: str
    blends: bool  # whether its calls take alpha and beta (ucudnn.core.accumulation)

    def ranked(self, problem: ConvProblem) -> list[str]:
        """The ids of every candidate of micro-batch kernel `problem`, cuDNN's heuristic
        favourite first; cheap: nothing is built (a search times the first few, ucudnn.optimizers.search)."""

    def candidate(self, problem: ConvProblem, candidate: str) -> Candidate:
        """One ranked candidate with its workspace and status (building its plan where needed)."""

    def prepare(self, step: Step) -> Plan:
        """The plan of `step` (see ucudnn.execute.dispatch.Plan)."""

    def set_stream(self, stream: int) -> None:
        """Queue later work on `stream`."""

    def release(self) -> None:
        """Drop what was built only to measure (plans not in use)."""

    def close(self) -> None:
        """Free what the backend holds of its own (a handle); its calls can no longer run."""


def candidates(backend: Backend, problem: ConvProblem) -> list[Candidate]:
    """Every candidate of `backend` for micro-batch kernel `problem`, in its ranking's order."""
    return [backend.candidate(problem, c) for c in backend.ranked(problem)]


def _no_device(*args) -> None:
    raise RuntimeError("these backends were made without a device to combine or allocate on; "
                       "make them with ucudnn.execute.backends.open_backends")


class Backends:
    """The backends a handle or benchmarker uses, by name: routes each step to its backend and
    composes the step's whole call (ucudnn.execute.dispatch.compose) with Combine steps on the GPU."""

    def __init__(self, backends: Iterable[Backend],
                 combine: Callable[[ConvProblem, Combine, dict, int], None] = _no_device,
                 alloc: Callable[[int], Any] = _no_device,
                 copy: Callable[[int, int, int, int], None] = _no_device):
        """`combine(problem, combine, buffers, stream)` runs a Combine step; `alloc(nbytes)` gives
        memory (an address, or an object with .ptr) for the rare call that needs a buffer of its
        own; `copy(dst, src, nbytes, stream)` copies a staged slice (ucudnn.core.staging).
        ucudnn.execute.backends.open_backends passes the GPU's."""
        self.by_name = {b.name: b for b in backends}
        self.stream = 0
        self._combine, self._alloc, self._copy = combine, alloc, copy
        self._scratch: list[Any] = []  # what alloc returned, kept

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    def __getitem__(self, name: str) -> Backend:
        try:
            return self.by_name[name]
        except KeyError:
            raise ConfigError(f"backend {name!r} is not in use here (in use: {', '.join(self.by_name)}); "
                              "set backend='all' or the backend the configuration names") from None

    def blends(self, algo: str) -> bool:
        return self[backend_of(algo)].blends

    def prepare_plan(self, step: Step) -> Plan:
        """The plan of `step` alone, as its backend makes it."""
        return self[backend_of(step.algo)].prepare(step)

    def prepare(self, step: Step) -> StepRun:
        return compose(step, self.prepare_plan(step), self._run_combine, self._scratch_buffer, self._run_copy)

    def _run_combine(self, problem: ConvProblem, c: Combine, buffers: dict) -> None:
        self._combine(problem, c, buffers, self.stream)

    def _run_copy(self, dst: int, src: int, nbytes: int) -> None:
        self._copy(dst, src, nbytes, self.stream)

    def _scratch_buffer(self, nbytes: int) -> int:
        """A buffer of `nbytes` kept as long as these backends (a call's own, see ucudnn.execute.dispatch)."""
        buffer = self._alloc(nbytes)
        self._scratch.append(buffer)
        return buffer if isinstance(buffer, int) else buffer.ptr

    def set_stream(self, stream: int) -> None:
        self.stream = stream
        for backend in self.by_name.values():
            backend.set_stream(stream)

    def release(self) -> None:
        for backend in self.by_name.values():
            backend.release()

    def close(self) -> None:
        for backend in self.by_name.values():
            backend.close()
