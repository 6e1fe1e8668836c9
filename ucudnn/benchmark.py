"""Benchmarking t(a, b) and ws(a, b): every algorithm at every micro-batch size of a policy."""
from __future__ import annotations

from typing import Iterable, Protocol

from .device import DeviceInfo
from .measurements import Measurement
from .problem import ConvProblem


class Benchmarker(Protocol):
    """Measures kernels on one device. The GPU implementation is `CudnnBenchmarker`; tests use fakes."""

    device: DeviceInfo

    def measure(self, problem: ConvProblem, sizes: Iterable[int], cap: int | None) -> list[Measurement]:
        """One Measurement per (algorithm, size): time only for algorithms whose workspace is
        <= cap bytes (None: any that can be allocated); the others are recorded OVER_CAP."""
