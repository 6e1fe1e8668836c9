"""The little of CUDA that ucudnn needs, through CuPy: device facts, memory, streams, events."""
from __future__ import annotations

import functools
import sys
import time
from types import ModuleType
from typing import Any, Protocol

from ..core.device import Provenance
from ..core.errors import GpuUnavailableError, gpu_install


class _Tensor(Protocol):  # a torch tensor
    def data_ptr(self) -> int: ...


class _Memory(Protocol):  # a CuPy MemoryPointer
    @property
    def ptr(self) -> int: ...


class _Array(Protocol):  # a CuPy array
    @property
    def data(self) -> _Memory: ...


# Device memory as ucudnn takes it: an address, a torch tensor, a CuPy array or MemoryPointer, or
# None (address 0)
Buffer = int | _Tensor | _Array | _Memory | None


def cupy() -> ModuleType:
    try:
        import cupy as cp
    except ImportError as exc:
        raise GpuUnavailableError(
            f"CuPy is not installed; install ucudnn with a GPU extra: {gpu_install()}"
        ) from exc
    return cp


def loaded() -> bool:
    """Whether CuPy has been imported in this process (nothing of it to give back otherwise)."""
    return "cupy" in sys.modules


def device_info(device: int | None = None, frontend_version: str = "") -> Provenance:
    """The current (or given) GPU and the loaded cuDNN, with the cuDNN frontend's version where
    the caller's measurements use the engines (backends.base.frontend_version)."""
    from .bindings import cudnn

    cp = cupy()
    device = cp.cuda.runtime.getDevice() if device is None else device
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Provenance(gpu_name=name, compute_capability=f"{props['major']}.{props['minor']}",
                      cudnn_version=cudnn.version(), driver_version=cp.cuda.runtime.driverGetVersion(),
                      frontend_version=frontend_version)


def random_array(shape: tuple[int, ...], dtype: str, seed: int = 0):
    """Uniform(-1, 1) data on the GPU; bfloat16 as its raw 16-bit pattern (CuPy has no bf16)."""
    cp = cupy()
    values = cp.random.default_rng(seed).uniform(-1.0, 1.0, shape, dtype=cp.float32)
    if dtype == "bfloat16":
        return (values.view(cp.uint32) >> 16).astype(cp.uint16)
    return values.astype(dtype)


def alloc(nbytes: int) -> Any:
    """Device memory from CuPy's pool (kept alive by the returned object; `.ptr` is the address)."""
    return cupy().cuda.alloc(max(nbytes, 1))


def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Copy `nbytes` from device address `src` to `dst`, queued on `stream` (capturable in a graph)."""
    runtime = cupy().cuda.runtime
    runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDeviceToDevice, stream)


def free_pool() -> None:
    """Return the unused blocks of CuPy's memory pool to the device."""
    cupy().get_default_memory_pool().free_all_blocks()


def pointer(buffer: Buffer) -> int:
    """The device address of a CuPy array/MemoryPointer, a torch tensor, an int, or None (0)."""
    if buffer is None:
        return 0
    if isinstance(buffer, int):
        return buffer
    if hasattr(buffer, "data_ptr"):
        return buffer.data_ptr()
    data: _Memory = buffer.data if hasattr(buffer, "data") else buffer
    return data.ptr


def current_stream() -> int:
    return cupy().cuda.get_current_stream().ptr


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}"""


@functools.cache
def _spin_kernel():
    return cupy().RawKernel(_SPIN, "spin")


@functools.cache
def _clock_khz(device: int) -> int:
    return cupy().cuda.runtime.getDeviceProperties(device)["clockRate"]


def spin(ms: float, stream: int) -> None:
    """Keep the GPU busy for about `ms` milliseconds on `stream` (one thread spinning)."""
    cp = cupy()
    cycles = int(ms * _clock_khz(cp.cuda.runtime.getDevice()))
    with cp.cuda.ExternalStream(stream):
        _spin_kernel()((1,), (1,), (cp.int64(cycles),))


SPIN_FLOOR_MS, SPIN_SLACK, SPIN_MAX_MS = 0.2, 2.0, 500.0


class HostPace:
    """How long the host took to queue one call of a kind of run, last time it was timed (ms):
    what sizes the spin that hides the next one's host side, without a sizing call."""

    def __init__(self, ms: float = 0.2):
        self.ms = ms


def time_calls(run, repeats: int, stream: int, hide_host: bool | HostPace = False) -> list[float]:
    """Milliseconds of each of `repeats` calls of run(), timed with CUDA events on `stream`.
    With `hide_host`, a spinning kernel holds the GPU while the host queues every call, so the
    events see GPU time alone, as in a training loop that runs ahead of the GPU; without it, a
    call whose host side outlasts its GPU side is timed at its host's pace. The spin is sized
    from one untimed call of run() (True), or, saving that call, from the HostPace of calls of
    the same kind; where queueing outlasted the spin (a plan's first call may load its code),
    the calls are timed again with a spin sized from what they took."""
    if not hide_host:
        return _timed(run, repeats, stream, 0.0)[0]
    pace = hide_host if isinstance(hide_host, HostPace) else None
    if pace is None:
        began = time.perf_counter()
        run()
        pace = HostPace((time.perf_counter() - began) * 1e3)
    for _ in range(3):
        spin_ms = min(SPIN_FLOOR_MS + SPIN_SLACK * repeats * pace.ms, SPIN_MAX_MS)
        times, queued_ms = _timed(run, repeats, stream, spin_ms)
        pace.ms = queued_ms / repeats
        if queued_ms <= 0.9 * spin_ms:
            break
    return times


def _timed(run, repeats: int, stream: int, spin_ms: float) -> tuple[list[float], float]:
    """(milliseconds of each call, host milliseconds from the spin's launch to the last call queued)."""
    rt = cupy().cuda.runtime
    events = [(rt.eventCreate(), rt.eventCreate()) for _ in range(repeats)]
    try:
        began = time.perf_counter()
        if spin_ms:
            spin(spin_ms, stream)
        for start, end in events:
            rt.eventRecord(start, stream)
            run()
            rt.eventRecord(end, stream)
        queued_ms = (time.perf_counter() - began) * 1e3
        rt.eventSynchronize(events[-1][1])
        return [rt.eventElapsedTime(start, end) for start, end in events], queued_ms
    finally:
        for pair in events:
            for event in pair:
                rt.eventDestroy(event)
