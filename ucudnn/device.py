"""The GPU and cuDNN a measurement was taken on: results are reused only on the same pair."""
from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceInfo:
    """Provenance of measurements. `reuse_key` is what must match for another process to reuse them."""

    gpu_name: str
    compute_capability: str
    cudnn_version: int
    driver_version: int = 0
    host: str = field(default_factory=socket.gethostname)

    @property
    def reuse_key(self) -> tuple[str, int]:
        return (self.gpu_name, self.cudnn_version)

    def describe(self) -> str:
        v = self.cudnn_version
        return f"{self.gpu_name} (sm {self.compute_capability}), cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}"
