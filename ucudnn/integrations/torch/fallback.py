"""Why a call goes to torch's own convolution instead, said once per reason."""
from __future__ import annotations

import warnings

from ...errors import NoAlgorithmError, UcudnnWarning, UnsupportedProblemError

# Planning errors that mean "ucudnn cannot run this kernel": it then runs through torch instead.
UNPLANNABLE = (NoAlgorithmError, UnsupportedProblemError)

_warned: set[str] = set()


def warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"ucudnn.torch falls back to torch's own convolution: {reason}", UcudnnWarning,
                      stacklevel=4)
