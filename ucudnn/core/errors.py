"""The exceptions ucudnn raises. Every message names the bad value and the way to fix it."""
from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import metadata

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where ucudnn/ is


def install_extra(extra: str) -> str:
    """The command that installs one of ucudnn's extras, as this ucudnn was installed. pip adds an
    extra's packages to an installed ucudnn (a wheel, or a clone installed editable) by its name,
    though ucudnn is not on PyPI; a source tree that no pip installed, by its path."""
    try:
        metadata.distribution("ucudnn")
    except metadata.PackageNotFoundError:
        return f"pip install '{_TREE}[{extra}]'"
    return f"pip install 'ucudnn[{extra}]'"


def gpu_install() -> str:
    """The command that installs what ucudnn needs on a GPU: CuPy, cuDNN 9 and nvidia-cudnn-frontend."""
    return f"{install_extra('cuda13')} (for CUDA 12: [cuda12])"


class UcudnnError(Exception):
    """Base of every error ucudnn raises on purpose."""


class ConfigError(UcudnnError, ValueError):
    """A setting (keyword argument or UCUDNN_* variable) has a value ucudnn cannot use."""


def unknown(value, choices, name: str = "") -> ConfigError:
    """The error of a value that is none of `choices`: the value (as `name`=value where named)
    and every choice."""
    named = f"{name}={value!r}" if name else repr(value)
    return ConfigError(f"{named} is unknown; use one of {', '.join(map(str, choices))}")


class UnsupportedProblemError(UcudnnError, ValueError):
    """A convolution ucudnn cannot split (e.g. a tensor whose batch is not its outermost dimension)."""


class CudnnError(UcudnnError):
    """A cuDNN call returned a status other than CUDNN_STATUS_SUCCESS."""

    def __init__(self, call: str, status: int, status_name: str):
        self.call, self.status, self.status_name = call, status, status_name
        super().__init__(f"{call} failed with {status_name} ({status})")

    @property
    def refused(self) -> bool:
        """Whether cuDNN refused the call's parameters (a status of the BAD_PARAM or NOT_SUPPORTED
        class: cuDNN 9 groups its codes by thousands, 2xxx and 3xxx) rather than failing to run it."""
        return self.status // 1000 in (2, 3)


class LibraryNotFoundError(UcudnnError, OSError):
    """libcudnn (or the CUDA runtime) could not be found or loaded."""


class BackendUnavailableError(UcudnnError, ImportError):
    """A backend the settings ask for cannot be used here (e.g. `engines` without nvidia-cudnn-frontend)."""


class CandidateError(UcudnnError):
    """A configuration names a candidate its backend cannot build or run here (e.g. measured with
    another cuDNN): re-measure the kernel (ucudnn bench) or pick another backend."""


class GpuUnavailableError(UcudnnError):
    """A GPU is needed for this (benchmarking, dispatch) but none is usable."""


class GraphCaptureError(UcudnnError):
    """A kernel's calls could not be captured into a CUDA graph (the handle then runs them directly)."""


class NoAlgorithmError(UcudnnError):
    """No cuDNN algorithm can run a kernel within the given workspace limit."""


class DeviceMemoryError(UcudnnError, MemoryError):
    """The GPU has too little free memory for something ucudnn must allocate (benchmark operands,
    a workspace): free memory, lower the workspace limit, or benchmark ahead with `ucudnn bench`."""

    def __init__(self, what: str, nbytes: int, fix: str = ""):
        self.what, self.nbytes = what, nbytes
        super().__init__(f"out of GPU memory allocating {nbytes / 2**20:.1f} MiB for {what}"
                         + (f"; {fix}" if fix else ""))


class InfeasibleError(UcudnnError):
    """No combination of configurations fits the total workspace limit."""

    def __init__(self, limit: int, smallest_feasible: int):
        self.limit, self.smallest_feasible = limit, smallest_feasible
        super().__init__(
            f"total workspace limit {limit} bytes ({limit / 2**20:.2f} MiB) is infeasible: "
            f"the smallest total that fits every kernel is {smallest_feasible} bytes "
            f"({smallest_feasible / 2**20:.2f} MiB); raise the limit to at least that"
        )


class MissingMeasurementsError(UcudnnError):
    """The optimizer needs measurements that are neither cached nor measurable here: where known,
    of `problem` (a ConvProblem) at the micro-batch sizes `missing`."""

    def __init__(self, message: str, problem=None, missing: Iterable[int] = ()):
        self.problem, self.missing = problem, tuple(missing)
        super().__init__(message)


class CacheError(UcudnnError):
    """The benchmark database cannot be used (e.g. it was written by a newer ucudnn)."""


class DamagedDatabaseError(CacheError):
    """A benchmark database file is damaged (SQLite finds it malformed or not a database)."""

    def __init__(self, path, reason: object):
        self.path, self.reason = path, reason
        super().__init__(
            f"benchmark database {path} is damaged ({reason}): check it with `ucudnn cache verify "
            f"--cache {path}`; rebuild it by moving it away (ucudnn starts a new file there) and "
            f"re-measuring or importing an export (`ucudnn cache import`), or point UCUDNN_CACHE "
            f"(or --cache) at another file"
        )


class ReadOnlyDatabaseError(CacheError):
    """A benchmark database (or its folder, where SQLite writes its journal) cannot be written."""

    def __init__(self, path, reason: object):
        self.path = path
        super().__init__(
            f"benchmark database {path} is read-only ({reason}): make the file and its folder "
            f"writable, or point UCUDNN_CACHE (or --cache) at a writable path"
        )


class InterruptedWriteError(ReadOnlyDatabaseError):
    """A benchmark database holds the journal of a write its process was killed in: SQLite must roll
    it back before anyone reads the file, and this process cannot write the file or its folder."""

    def __init__(self, path, reason: object):
        self.path = path
        CacheError.__init__(
            self, f"benchmark database {path} holds the journal of a write that was interrupted ({path}-journal), "
            f"which must be rolled back before the file can be read, and this process cannot write the file "
            f"or its folder ({reason}): run any ucudnn command on it once as a user who can write both (e.g. "
            f"`ucudnn cache verify --cache {path}`), or point UCUDNN_CACHE (or --cache) at another file"
        )


class DatabaseFullError(CacheError):
    """A benchmark database cannot grow: the filesystem it is on is full. What the file held is intact
    (the write that did not fit was rolled back)."""

    def __init__(self, path, reason: object):
        self.path = path
        super().__init__(
            f"benchmark database {path} cannot grow: its filesystem is full ({reason}); what the file held "
            f"is intact: free space there, or point UCUDNN_CACHE (or --cache) at a file on another filesystem"
        )


class UcudnnWarning(UserWarning):
    """Something went wrong that ucudnn can work around (e.g. an unusable benchmark database):
    it carries on, possibly slower, and says so once."""
