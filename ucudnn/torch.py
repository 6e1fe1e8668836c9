"""`import ucudnn.torch`: the PyTorch integration (see ucudnn.integrations.torch and docs/torch.md)."""
from .integrations.torch import (Conv2d, Context, CudaBackend, context_of, convert, default_context,  # noqa: F401
                                 learn, network)
from .integrations.torch import __all__  # noqa: F401
