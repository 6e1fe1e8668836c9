"""`import ucudnn.torch`: the PyTorch integration (see ucudnn.integrations.torch and docs/torch.md)."""
from .integrations.torch import (Context, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
                                 context_of, convert, learn, network)

__all__ = ["Context", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "context_of", "convert", "learn", "network"]
