"""The cuDNN bindings' errors without a GPU: a fake libcudnn stands in for the real one."""
from __future__ import annotations

import pytest

from ucudnn import Handle
from ucudnn.core.errors import GpuUnavailableError, LibraryNotFoundError, gpu_install
from ucudnn.execute.bindings import cudnn, library

NOT_INITIALIZED, BAD_PARAM = 1001, 2000
NAMES = {NOT_INITIALIZED: b"CUDNN_STATUS_NOT_INITIALIZED", BAD_PARAM: b"CUDNN_STATUS_BAD_PARAM"}


class FakeCudnn:
    """libcudnn as it is where the CUDA wheels are installed but no GPU is usable."""

    def __init__(self, create_status: int):
        self.create_status = create_status

    def cudnnCreate(self, handle) -> int:
        return self.create_status

    def cudnnGetErrorString(self, status: int) -> bytes:
        return NAMES[status]


def test_a_machine_without_a_gpu_gets_gpu_unavailable_not_a_cudnn_status(monkeypatch):
    monkeypatch.setattr(cudnn, "_lib", FakeCudnn(NOT_INITIALIZED))
    with pytest.raises(GpuUnavailableError, match="no usable NVIDIA GPU or driver here") as error:
        cudnn.create_handle()
    assert "CUDNN_STATUS_NOT_INITIALIZED" in str(error.value)
    with pytest.raises(GpuUnavailableError):
        Handle(cache=object())


def test_other_cudnn_create_failures_stay_cudnn_errors(monkeypatch):
    monkeypatch.setattr(cudnn, "_lib", FakeCudnn(BAD_PARAM))
    with pytest.raises(cudnn.CudnnError, match="CUDNN_STATUS_BAD_PARAM"):
        cudnn.create_handle()


def test_missing_cudnn_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(library, "candidates", lambda: [("test", "/nonexistent/libcudnn.so.9")])
    with pytest.raises(LibraryNotFoundError) as error:
        library.load()
    assert gpu_install() in str(error.value) and "[cuda13]" in str(error.value)
