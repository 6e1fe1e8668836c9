"""Where and how measurements were taken. `Hardware` is the GPU, its cuDNN and driver and the
host; `MeasurementKind` is how the times were taken: the execution they predict and the timing
preset. A `Provenance` is both, the record every measurement carries: results are reused only where
GPU, cuDNN and execution match. The timing preset ranks measurements: a `quick` one never replaces
a `default` one."""
from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field, fields, replace

from .errors import unknown

# How a kernel's calls reach the GPU, which is also how its measurements are timed:
#   direct - one host call per micro-batch, timed as such (host time shows where it outlasts the GPU's)
#   graph  - the calls captured once into a CUDA graph and replayed, timed on the GPU alone
EXECUTIONS = ("graph", "direct")
# How carefully measurements were timed, best first: the names of benchmark.TIMINGS
TIMING_PRESETS = ("default", "quick")


def check_execution(execution: str) -> str:
    if execution not in EXECUTIONS:
        raise unknown(execution, EXECUTIONS, "execution")
    return execution


def check_timing(timing: str) -> str:
    if timing not in TIMING_PRESETS:
        raise unknown(timing, TIMING_PRESETS, "timing")
    return timing


@dataclass(frozen=True)
class Hardware:
    """The GPU and software stack measurements were taken on."""

    gpu_name: str
    compute_capability: str
    cudnn_version: int
    driver_version: int = 0
    host: str = field(default_factory=socket.gethostname)
    # nvidia-cudnn-frontend's version where the engines were measured ('' : legacy only). Not part
    # of the reuse key: engines and their knobs are cuDNN's, the frontend only lists and wraps them.
    frontend_version: str = ""

    def describe(self) -> str:
        v = self.cudnn_version
        return f"{self.gpu_name} (sm {self.compute_capability}), cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}"


@dataclass(frozen=True)
class MeasurementKind:
    """How measurements were taken: for which execution (EXECUTIONS) and with which timing
    preset (TIMING_PRESETS)."""

    execution: str = "direct"  # what the times predict
    timing: str = "default"  # not part of a Provenance's reuse_key: it ranks, it does not separate

    def __post_init__(self):
        check_execution(self.execution)
        check_timing(self.timing)

    def describe(self) -> str:
        return f"{self.execution} execution"


@dataclass(frozen=True)
class Provenance(MeasurementKind, Hardware):
    """The hardware measurements were taken on and how they were taken, flat as the database
    stores them: Provenance(gpu_name, compute_capability, cudnn_version, driver_version, host,
    execution=..., timing=...). `reuse_key` is what must match for another process to reuse them."""

    @classmethod
    def of(cls, hardware: Hardware, kind: MeasurementKind = MeasurementKind()) -> Provenance:
        return cls(**asdict(hardware), **asdict(kind))

    @property
    def hardware(self) -> Hardware:
        return Hardware(**{f.name: getattr(self, f.name) for f in fields(Hardware)})

    @property
    def kind(self) -> MeasurementKind:
        return MeasurementKind(self.execution, self.timing)

    @property
    def reuse_key(self) -> tuple[str, int, str]:
        return (self.gpu_name, self.cudnn_version, self.execution)

    def for_execution(self, execution: str) -> Provenance:
        return replace(self, execution=execution)

    def for_timing(self, timing: str) -> Provenance:
        return replace(self, timing=timing)

    def describe(self) -> str:
        return f"{Hardware.describe(self)}, {MeasurementKind.describe(self)}"
