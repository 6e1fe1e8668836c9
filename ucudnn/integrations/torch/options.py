"""What only ucudnn.torch reads, beside the settings the Planner reads (ucudnn.plan.config.Settings):
each from its keyword (convert, Context), else its UCUDNN_* variable, else its default."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ...plan.config import flag

# Each option's variable, read as Settings.load reads its own (README, "Settings come from")
VARIABLES = {"concurrent_backward": "UCUDNN_CONCURRENT_BACKWARD"}


@dataclass(frozen=True)
class TorchOptions:
    """Build with `TorchOptions.load(...)`."""

    # A converted layer's BF on a side stream beside its BD (each with a workspace of its own; a
    # delegated layer's torch kernels too), joined before the layer's backward returns (Context.beside).
    # Off: it pays only where kernels leave the GPU room (docs/results.md, "what concurrency can
    # reach, the SM carveout, and BF beside BD in layers left to torch")
    concurrent_backward: bool = False

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> TorchOptions:
        """Keyword arguments (None: not given) win over the variables, which win over the defaults."""
        env = os.environ if env is None else env
        values = {}
        for name in (f.name for f in fields(cls)):
            variable = VARIABLES[name]
            if overrides.get(name) is not None:
                values[name] = _PARSERS[name](overrides[name], name)
            elif variable in env:
                values[name] = _PARSERS[name](env[variable], variable)
        return cls(**values)


_PARSERS: dict[str, Callable[[Any, str], Any]] = {"concurrent_backward": flag}  # (value, the name an error shows)
