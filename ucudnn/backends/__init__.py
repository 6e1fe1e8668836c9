"""Backends: where a kernel's candidates come from, and how one runs at pointer offsets.

- `legacy`: cuDNN's legacy convolution API (ucudnn.bindings): one candidate per algorithm.
- `engines`: cuDNN's graph API through nvidia-cudnn-frontend: one candidate per engine
  configuration (engine id and knobs) that heuristics modes A, B and FALLBACK list.

A candidate is named `backend:name`, e.g. `legacy:FFT_TILING` or
`engines:eng67_k2=9_k13=0_k18=0`: that id, never a list index, is what measurements,
configurations and the cache hold. The `backend` setting picks the space: `all` (both; the
default where the frontend imports), `engines` or `legacy`.
"""
from __future__ import annotations

from .base import (BACKENDS, CHOICES, FRONTEND_PACKAGE, Backend, Backends, Candidate, candidates,  # noqa: F401
                   backend_of, candidate_id, frontend_installed, frontend_version, resolve, split_id)


def open_backends(choice: str, cudnn_handle, stream: int) -> Backends:
    """The GPU backends of a `backend` setting, on `stream`: `legacy` on `cudnn_handle`,
    `engines` on it too where it can (see EnginesBackend). BackendUnavailableError where the
    setting asks for the engines and the frontend is not installed."""
    backends: list[Backend] = []
    for name in resolve(choice):
        if name == "legacy":
            from .legacy import LegacyBackend

            backends.append(LegacyBackend(cudnn_handle))
        else:
            from .engines import EnginesBackend

            backends.append(EnginesBackend(cudnn_handle))
    from .. import gpu
    from .combine import run as combine

    opened = Backends(backends, combine=combine, alloc=gpu.alloc, copy=gpu.copy)
    opened.set_stream(stream)
    return opened
