"""`import ucudnn.torch`: the PyTorch integration (see ucudnn.integrations.torch and docs/torch.md)."""
from .integrations.torch import *  # noqa: F403  (its public face, listed once there)
from .integrations.torch import __all__  # noqa: F401
