"""What every backend shares: candidate ids, the Backend interface, the set a handle uses."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..dispatch import Call, Step
    from ..problem import ConvProblem

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
        raise ConfigError(f"backend={choice!r} is unknown; use one of {', '.join(CHOICES)}")
    if choice == "":
        choice = "all" if (frontend_installed() if frontend is None else frontend) else "legacy"
    return BACKENDS if choice == "all" else (choice,)


@dataclass(frozen=True)
class Candidate:
    """One way a backend can run a micro-batch kernel: its id, the workspace bytes it needs
    (partial-sum buffers included) and whether it can run (measurements.OK) or why not."""

    id: str
    workspace: int
    status: str


class Backend(Protocol):
    name: str

    def candidates(self, problem: "ConvProblem", batch: int) -> list[Candidate]:
        """Every candidate of micro-batch kernel `problem`, part of a kernel of `batch` samples
        (backward-filter micro-batches then accumulate, which may need buffers)."""

    def prepare(self, step: "Step") -> "Call":
        """A call that runs `step` on device addresses (see ucudnn.dispatch)."""

    def set_stream(self, stream: int) -> None:
        """Queue later work on `stream`."""

    def release(self) -> None:
        """Drop what was built only to measure (plans not in use)."""

    def close(self) -> None:
        """Free what the backend holds of its own (a handle); its calls can no longer run."""


class Backends:
    """The backends a handle or benchmarker uses, by name: routes each step to its backend."""

    def __init__(self, backends: Iterable[Backend]):
        self.by_name = {b.name: b for b in backends}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    def __getitem__(self, name: str) -> Backend:
        try:
            return self.by_name[name]
        except KeyError:
            raise ConfigError(f"backend {name!r} is not in use here (in use: {', '.join(self.by_name)}); "
                              "set backend='all' or the backend the configuration names") from None

    def prepare(self, step: "Step") -> "Call":
        return self[backend_of(step.algo)].prepare(step)

    def set_stream(self, stream: int) -> None:
        for backend in self.by_name.values():
            backend.set_stream(stream)

    def release(self) -> None:
        for backend in self.by_name.values():
            backend.release()

    def close(self) -> None:
        for backend in self.by_name.values():
            backend.close()
