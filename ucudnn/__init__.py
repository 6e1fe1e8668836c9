"""ucudnn: micro-batched cuDNN convolutions that run fast algorithms under tight workspace limits."""
from .config import Settings, batch_sizes, format_size, parse_size
from .device import Provenance
from .handle import Handle
from .errors import (CacheError, ConfigError, CudnnError, DeviceMemoryError, GpuUnavailableError, InfeasibleError,
                     LibraryNotFoundError, MissingMeasurementsError, NoAlgorithmError, UcudnnError, UcudnnWarning,
                     UnsupportedProblemError)
from .measurements import KernelTable, Measurement
from .optimizers.configuration import Configuration, MicroConfig
from .optimizers.wr import optimize_wr
from .problem import ConvKind, ConvProblem

__all__ = [
    "Handle", "Settings", "ConvProblem", "ConvKind", "Configuration", "MicroConfig", "Measurement", "KernelTable",
    "Provenance", "optimize_wr", "batch_sizes", "format_size", "parse_size",
    "UcudnnError", "ConfigError", "CacheError", "CudnnError", "DeviceMemoryError", "GpuUnavailableError",
    "InfeasibleError", "LibraryNotFoundError", "MissingMeasurementsError", "NoAlgorithmError",
    "UnsupportedProblemError", "UcudnnWarning",
]
__version__ = "0.1.0"
