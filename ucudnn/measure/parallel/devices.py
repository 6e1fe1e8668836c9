"""GPU checks, timing presets (benchmark.TIMINGS) and backends: the benchmarker a worker makes on its GPU, what a
GPU is (probed without a context), and the refusal of GPUs listed twice or of different models."""
from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from ...core.device import Provenance, check_execution, check_timing
from ...core.errors import ConfigError
from ..benchmark import TIMINGS, Benchmarker, TimingSettings

Factory = Callable[[int], Benchmarker]

DEVICES_VARIABLE = "UCUDNN_BENCH_DEVICES"


# ---- devices


def parse_devices(text: str) -> list[int]:
    """GPU numbers from "0" or "0,1"."""
    parts = text.split(",")
    if not all(part.strip().isdigit() for part in parts):
        raise ConfigError(f"{text!r} is not a list of GPU numbers; use e.g. 0 or 0,1")
    return [int(part) for part in parts]


def bench_devices(devices: Sequence[int] | None = None, mpi: bool = False,
                  env: Mapping[str, str] | None = None) -> list[int] | None:
    """`devices`, else $UCUDNN_BENCH_DEVICES, else GPU 0 (with `mpi`: None, every GPU of the node)."""
    if devices:
        return list(devices)
    text = (os.environ if env is None else env).get(DEVICES_VARIABLE, "").strip()
    if text:
        try:
            return parse_devices(text)
        except ConfigError as exc:
            raise ConfigError(f"{DEVICES_VARIABLE}: {exc}") from None
    return None if mpi else [0]


def timing_settings(timing: str | TimingSettings) -> TimingSettings:
    if isinstance(timing, TimingSettings):
        return timing
    return TIMINGS[check_timing(timing)]


def backend_setting(backends: Sequence[str]) -> str:
    """The `backend` setting that names exactly `backends` (what ucudnn.execute.backends.resolve gave the
    process that plans), whatever is installed where its workers read it."""
    return backends[0] if len(backends) == 1 else "all"


def cuda_benchmarker(device: int, timing: TimingSettings = TIMINGS["default"], execution: str = "graph",
                     backend: str = "") -> Benchmarker:
    """A CudnnBenchmarker of `backend` on GPU `device` (made current first), the workers' default."""
    from ...execute import gpu
    from ..benchmark import CudnnBenchmarker

    gpu.cupy().cuda.Device(device).use()
    return CudnnBenchmarker(timing=timing, execution=execution, backend=backend)


def default_factory(timing: str | TimingSettings, execution: str = "graph", backend: str = "") -> Factory:
    """cuda_benchmarker with these timing settings, for this execution and backend setting,
    picklable for the workers."""
    return functools.partial(cuda_benchmarker, timing=timing_settings(timing), execution=check_execution(execution),
                             backend=backend)


def cuda_device_count() -> int:
    from ...execute import gpu

    return gpu.cupy().cuda.runtime.getDeviceCount()


def cuda_probe(device: int) -> Provenance:
    """What GPU `device` is, without making a context on it."""
    from ...execute import gpu

    count = cuda_device_count()
    if not 0 <= device < count:
        raise ConfigError(f"GPU {device} does not exist: this node has {count} visible GPU(s), "
                          f"0 to {count - 1}; fix --devices or {DEVICES_VARIABLE}")
    return gpu.device_info(device)


def check_devices(devices: Sequence[int]) -> list[int]:
    devices = list(devices)
    if not devices:
        raise ConfigError(f"no GPUs to benchmark on; list some, e.g. --devices 0,1 or {DEVICES_VARIABLE}=0,1")
    twice = sorted(d for d, n in Counter(devices).items() if n > 1)
    if twice:
        raise ConfigError(f"GPU(s) {', '.join(map(str, twice))} listed more than once in {devices}; "
                          "list each GPU once (two workers on one GPU would distort each other's times)")
    return devices


def check_one_model(labelled: Sequence[tuple[str, Provenance]]) -> None:
    """Refuse GPUs of different models (or cuDNN versions): measurements are kept per model."""
    if len({info.reuse_key for _, info in labelled}) > 1:
        listing = "; ".join(f"{label}: {info.describe()}" for label, info in labelled)
        raise ConfigError(f"one benchmarking run needs GPUs of one model and cuDNN version, since "
                          f"measurements are kept per model, but it has {listing}. List GPUs of one "
                          f"model only (--devices or {DEVICES_VARIABLE}) and run once per model")
