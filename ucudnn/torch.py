"""`import ucudnn.torch`: the PyTorch integration (see ucudnn.integrations.torch and docs/torch.md)."""
from .integrations.torch import (Conv2d, Context, CudaBackend, convert, default_context, learn,  # noqa: F401
                                 network)
from .integrations.torch import __all__  # noqa: F401
