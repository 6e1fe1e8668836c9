"""The GPU and cuDNN a measurement was taken on, and the execution it was timed for: results are
reused only where all three match. The timing preset it was taken with is provenance that ranks
measurements: a `quick` one never replaces a `default` one."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace

from .errors import ConfigError

# How a kernel's calls reach the GPU, which is also how its measurements are timed:
#   direct - one host call per micro-batch, timed as such (host time shows where it outlasts the GPU's)
#   graph  - the calls captured once into a CUDA graph and replayed, timed on the GPU alone
EXECUTIONS = ("graph", "direct")
# How carefully measurements were timed (ucudnn.parallel.devices.TIMINGS), best first
TIMING_PRESETS = ("default", "quick")


def check_execution(execution: str) -> str:
    if execution not in EXECUTIONS:
        raise ConfigError(f"execution {execution!r} is unknown; use one of {', '.join(EXECUTIONS)}")
    return execution


def check_timing(timing: str) -> str:
    if timing not in TIMING_PRESETS:
        raise ConfigError(f"timing {timing!r} is unknown; use one of {', '.join(TIMING_PRESETS)}")
    return timing


@dataclass(frozen=True)
class DeviceInfo:
    """Provenance of measurements. `reuse_key` is what must match for another process to reuse them."""

    gpu_name: str
    compute_capability: str
    cudnn_version: int
    driver_version: int = 0
    host: str = field(default_factory=socket.gethostname)
    execution: str = "direct"  # what the times predict (EXECUTIONS)
    timing: str = "default"  # the timing preset of the measurements it records (TIMING_PRESETS); not part of reuse_key

    def __post_init__(self):
        check_execution(self.execution)
        check_timing(self.timing)

    @property
    def reuse_key(self) -> tuple[str, int, str]:
        return (self.gpu_name, self.cudnn_version, self.execution)

    def for_execution(self, execution: str) -> "DeviceInfo":
        return replace(self, execution=execution)

    def for_timing(self, timing: str) -> "DeviceInfo":
        return replace(self, timing=timing)

    def describe(self) -> str:
        v = self.cudnn_version
        return (f"{self.gpu_name} (sm {self.compute_capability}), cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}, "
                f"{self.execution} execution")
