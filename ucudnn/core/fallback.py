"""Why a call goes to its framework's own convolution instead (or an integration works around
something else), said once per reason."""
from __future__ import annotations

import warnings

from .errors import DeviceMemoryError, NoAlgorithmError, UcudnnWarning, UnsupportedProblemError

# Planning errors that mean "ucudnn cannot run this kernel": it then runs the framework's own
# convolution instead (DeviceMemoryError: too little memory even to benchmark it, or for a plan
# without workspace).
UNPLANNABLE = (NoAlgorithmError, UnsupportedProblemError, DeviceMemoryError)

_warned: set[str] = set()


def fall_back(own: str, reason: str) -> None:
    """Say once that a call runs `own`'s convolution (the framework's, e.g. 'torch') for `reason`."""
    say_once(f"ucudnn falls back to {own}'s own convolution: {reason}")


def say_once(message: str) -> None:
    """A UcudnnWarning, the first time `message` is said."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UcudnnWarning, stacklevel=5)
