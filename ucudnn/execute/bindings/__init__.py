"""ctypes bindings of cuDNN 9's legacy convolution API (libcudnn.so.9), loaded on first use."""
from __future__ import annotations


def gpu_available() -> bool:
    """Whether CuPy sees a CUDA device and cuDNN loads: what benchmarking and dispatch need."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        from . import cudnn

        cudnn.lib()
        return True
    except Exception:  # any failure to import, find a device or load cuDNN means "no"
        return False
