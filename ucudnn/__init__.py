"""ucudnn: micro-batched cuDNN convolutions that run fast algorithms under tight workspace limits."""
__version__ = "0.1.0"  # the one place of the version: pyproject.toml reads it (tool.setuptools.dynamic)

from .core.device import Provenance
from .core.errors import (
    CacheError,
    ConfigError,
    CudnnError,
    DeviceMemoryError,
    GpuUnavailableError,
    InfeasibleError,
    LibraryNotFoundError,
    MissingMeasurementsError,
    NoAlgorithmError,
    UcudnnError,
    UcudnnWarning,
    UnsupportedProblemError,
)
from .core.log import log_to_stderr
from .core.measurements import KernelTable, Measurement
from .core.problem import ConvKind, ConvProblem, Kernel
from .handle import Handle
from .optimizers.configuration import Configuration, MicroConfig
from .optimizers.wd import optimize_wd
from .optimizers.wr import optimize_wr
from .plan.config import Settings, batch_sizes, format_size, parse_size

__all__ = [
    "Handle", "Settings", "ConvProblem", "ConvKind", "Kernel", "Configuration", "MicroConfig", "Measurement",
    "KernelTable", "Provenance", "optimize_wr", "optimize_wd", "batch_sizes", "format_size", "parse_size",
    "UcudnnError", "ConfigError", "CacheError", "CudnnError", "DeviceMemoryError", "GpuUnavailableError",
    "InfeasibleError", "LibraryNotFoundError", "MissingMeasurementsError", "NoAlgorithmError",
    "UnsupportedProblemError", "UcudnnWarning", "log_to_stderr",
]
