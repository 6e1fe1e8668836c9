"""ucudnn: micro-batched cuDNN convolutions that run fast algorithms under tight workspace limits."""
from .config import Settings, batch_sizes, format_size, parse_size
from .device import DeviceInfo
from .handle import Handle
from .errors import (CacheError, ConfigError, CudnnError, GpuUnavailableError, InfeasibleError,
                     LibraryNotFoundError, MissingMeasurementsError, NoAlgorithmError, UcudnnError,
                     UnsupportedProblemError)
from .measurements import KernelTable, Measurement
from .optimizers.configuration import Configuration, MicroConfig
from .optimizers.wr import optimize_wr
from .problem import ConvKind, ConvProblem

__version__ = "0.1.0"
