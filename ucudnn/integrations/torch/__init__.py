"""PyTorch integration: torch's convolution layers (1-D, 2-D, 3-D, transposed) whose convolutions
run micro-batched through ucudnn.

    import ucudnn.torch
    model = ucudnn.torch.convert(model, workspace_limit="64MiB")           # WR, every convolution layer
    model = ucudnn.torch.convert(model, optimizer="wd", sample_input=x)     # WD, solved once

`Conv2d` is an nn.Conv2d (same constructor, parameters and state_dict) whose forward and backward
(an autograd Function) run F, BD and BF through a ucudnn.Handle on torch's current CUDA stream
(the other twins likewise: layers.TWINS), directly on the tensors' memory; workspaces come from
torch's caching allocator. What ucudnn cannot run (CPU tensors, float64, asymmetric 'same' padding, ...) falls back to torch's own
convolution with a one-time warning naming the reason. Under torch's deterministic settings only
candidates cuDNN reports deterministic are planned. A layer that ucudnn would not speed up
(torch's own kernels fit the limit and are about as fast) is delegated to torch's own
convolution, which costs less host time (see delegation.py). See docs/torch.md.
"""
from __future__ import annotations

from ...core.errors import install_extra

try:
    import torch  # what this package needs first
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"ucudnn.torch needs PyTorch: {install_extra('torch')}") from exc
if not hasattr(torch.library, "custom_op"):  # pragma: no cover - depends on the environment
    raise ImportError(f"ucudnn.torch needs torch>=2.4 (torch.library.custom_op, for compiled and exported "
                      f"graphs); this is torch {torch.__version__}: {install_extra('torch')}")

from .context import Context, default_context  # noqa: F401  (the package's own use and tests)
from .distributed import rank_zero_first
from .kernels import TorchFramework  # noqa: F401  (the package's own use and tests)
from .layers import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    context_of,
    convert,
    network,
)
from .pool import TorchPool  # noqa: F401  (the package's own use and tests)

# the public face (ucudnn.torch); TorchFramework and default_context stay importable from here for
# the package's own use and tests
__all__ = ["Context", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "context_of", "convert", "network", "rank_zero_first"]
