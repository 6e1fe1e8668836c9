"""torch's own cuDNN handle, lent to ucudnn.torch so that it makes none of its own.

A cuDNN handle holds device memory of its own (docs/results-archive.md, "One cuDNN handle, and
the frontier of pressure"). Where memory is short, every MiB outside torch's pool is one that
torch's backward cannot have (docs/torch.md, "Under memory pressure"). torch keeps a handle per
device and thread but does not give it to Python. libtorch_cuda exports the C++ function that
hands it out, at::native::getCudnnHandle() (ATen/cudnn/Handle.h): the calling thread's handle of
the current device, set to torch's current stream.

ucudnn borrows it only where all of these hold; otherwise it makes its own and warns once why:
- the process has one libcudnn (a handle belongs to the library that made it, and ucudnn's bindings
  load the one torch loaded);
- the caller is the main thread (torch hands each thread a handle, and a finished thread's handle
  goes to the next thread that asks: a handle kept past its thread could be in use twice at once);
- torch's own convolution ran on this thread just before (a tiny one), so that the handle exists:
  getCudnnHandle reports failure by a C++ exception, which must not reach a ctypes call;
- libtorch_cuda exports the function under its C++ name (SYMBOL).
The borrowed handle is torch's, so ucudnn never destroys it, and sets its stream before each of its
direct runs (ucudnn.Handle does that for any handle it is lent; graph replays do not use it): torch
moves it to its current stream on each of torch's own calls.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import NamedTuple

from ...execute.bindings import library

SYMBOL = "_ZN2at6native14getCudnnHandleEv"  # at::native::getCudnnHandle()
LIBRARY = "libtorch_cuda.so"
TORCHS = "torch's"


class Lent(NamedTuple):
    """torch's handle (a c_void_p) and TORCHS, or None and why ucudnn makes its own."""

    handle: ctypes.c_void_p | None
    source: str


def _own(why: str) -> Lent:
    return Lent(None, f"ucudnn's own: {why}")


def _tiny_convolution(device) -> None:
    """A convolution through torch's cuDNN path on `device`: torch makes this thread's handle if
    it has none (raising RuntimeError, e.g. out of memory, where it cannot)."""
    import torch

    x = torch.zeros(1, 2, 4, 4, device=device)
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False), torch.no_grad():
        torch.nn.functional.conv2d(x, torch.zeros(2, 2, 3, 3, device=device))


def torch_cudnn_handle(device, warm: Callable[[object], None] = _tiny_convolution,
                       load: Callable[[str], ctypes.CDLL] = ctypes.CDLL) -> Lent:
    """torch's cuDNN handle of `device` (the current one) for this thread, or why not (see above).
    `warm(device)` runs torch's own convolution there; `load` opens a library."""
    if not str(device).startswith("cuda"):  # torch aborts the process asked for a handle with no CUDA device
        return _own(f"{device} is not a CUDA device")
    if threading.current_thread() is not threading.main_thread():
        return _own("asked for outside the main thread; torch's handles belong to threads")
    copies = library.copies_loaded()
    if copies != 1:
        return _own(f"{copies} copies of libcudnn are loaded; a handle works only with its own")
    try:
        warm(device)
    except RuntimeError as exc:
        return _own(f"torch's own cuDNN convolution failed here ({exc})")
    paths = list(library.mapped(LIBRARY).values())
    if not paths:
        return _own(f"{LIBRARY} is not loaded")
    try:
        get = getattr(load(paths[0]), SYMBOL)
    except (OSError, AttributeError) as exc:
        return _own(f"{paths[0]} does not export at::native::getCudnnHandle ({exc})")
    get.restype, get.argtypes = ctypes.c_void_p, []
    address = get()
    if not address:
        return _own("at::native::getCudnnHandle returned no handle")
    return Lent(ctypes.c_void_p(address), TORCHS)
