"""`import ucudnn.torch`: the PyTorch integration (see ucudnn.integrations.torch and docs/torch.md)."""
from .integrations.torch import Conv2d, Context, context_of, convert, learn, network

__all__ = ["Conv2d", "Context", "context_of", "convert", "learn", "network"]
