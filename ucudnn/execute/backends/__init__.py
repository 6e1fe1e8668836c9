"""Backends: where a kernel's candidates come from, and how one runs at pointer offsets.

- `legacy`: cuDNN's legacy convolution API (ucudnn.execute.bindings): one candidate per algorithm.
- `engines`: cuDNN's graph API through nvidia-cudnn-frontend: one candidate per engine
  configuration (engine id and knobs) that heuristics modes A, B and FALLBACK list.

A candidate is named `backend:name`, e.g. `legacy:FFT_TILING` or
`engines:eng67_k2=9_k13=0_k18=0`: that id, never a list index, is what measurements,
configurations and the cache hold. The `backend` setting picks the space: `all` (both; the
default where the frontend imports), `engines` or `legacy`.
"""
from __future__ import annotations

import importlib

from .base import (  # noqa: F401
    BACKENDS,
    CHOICES,
    FRONTEND_PACKAGE,
    Backend,
    Backends,
    Candidate,
    backend_of,
    candidate_id,
    candidates,
    frontend_installed,
    frontend_version,
    resolve,
    split_id,
)


def module(name: str):
    """The module of backend `name` (one of BACKENDS): one file each, found by name. Each has
    NAME, TASK_WEIGHT (its measuring cost against legacy's, for sharing sweeps among GPUs) and
    open_backend(cudnn_handle)."""
    return importlib.import_module(f".{name}", __name__)


def open_backends(choice: str, cudnn_handle, stream: int) -> Backends:
    """The GPU backends of a `backend` setting, on `stream`, each opened on `cudnn_handle` (see
    each module's open_backend). BackendUnavailableError where the setting asks for the engines
    and the frontend is not installed."""
    backends: list[Backend] = [module(name).open_backend(cudnn_handle) for name in resolve(choice)]
    from .. import gpu
    from .combine import run as combine

    opened = Backends(backends, combine=combine, alloc=gpu.alloc, copy=gpu.copy)
    opened.set_stream(stream)
    return opened
