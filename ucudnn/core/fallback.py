"""How ucudnn says what it works around: a UcudnnWarning per distinct message, once per process,
from rank 0 only under torch.distributed (ucudnn.core.log.is_rank_zero), attributed to the line of
the caller's code that led to it (the innermost frame outside ucudnn and torch, whose layers call
ucudnn's); and why a call goes to its framework's own convolution instead."""
from __future__ import annotations

import os
import sys
import warnings

from .errors import DeviceMemoryError, NoAlgorithmError, UcudnnWarning, UnsupportedProblemError
from .log import is_rank_zero

# Planning errors that mean "ucudnn cannot run this kernel": it then runs the framework's own
# convolution instead (DeviceMemoryError: too little memory even to benchmark it, or for a plan
# without workspace).
UNPLANNABLE = (NoAlgorithmError, UnsupportedProblemError, DeviceMemoryError)

_UCUDNN = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the package's folder, as its frames name it
_warned: set[str] = set()


def fall_back(own: str, reason: str) -> None:
    """Say once that a call runs `own`'s convolution (the framework's, e.g. 'torch') for `reason`."""
    say_once(f"ucudnn falls back to {own}'s own convolution: {reason}")


def say_once(message: str) -> None:
    """A UcudnnWarning, the first time `message` is said in this process, on rank 0."""
    if message in _warned or not is_rank_zero():
        return
    _warned.add(message)
    warnings.warn(message, UcudnnWarning, stacklevel=_callers_level())


def _inner_folders() -> tuple[str, ...]:
    """The folders whose frames a warning is not attributed to: ucudnn's, and torch's where it is imported."""
    torch = sys.modules.get("torch")
    found = getattr(torch, "__file__", None)
    return (_UCUDNN, os.path.dirname(found) + os.sep) if found else (_UCUDNN,)


def _callers_level() -> int:
    """warnings.warn's stacklevel, as say_once passes it, of the innermost frame outside
    _inner_folders (the outermost frame where every frame is inside)."""
    inner = _inner_folders()
    level, frame = 2, sys._getframe(2)  # 0: here; 1: say_once (stacklevel 1); 2: its caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inner):
        level, frame = level + 1, frame.f_back
    return level
