"""Why a call goes to torch's own convolution instead (or ucudnn.torch works around something
else), said once per reason."""
from __future__ import annotations

import warnings

from ...errors import DeviceMemoryError, NoAlgorithmError, UcudnnWarning, UnsupportedProblemError

# Planning errors that mean "ucudnn cannot run this kernel": it then runs through torch instead
# (DeviceMemoryError: too little memory even to benchmark it, or for a plan without workspace).
UNPLANNABLE = (NoAlgorithmError, UnsupportedProblemError, DeviceMemoryError)

_warned: set[str] = set()


def warn_once(reason: str) -> None:
    say_once(f"ucudnn.torch falls back to torch's own convolution: {reason}")


def say_once(message: str) -> None:
    """A UcudnnWarning, the first time `message` is said."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UcudnnWarning, stacklevel=5)
