"""One convolution layer's training step, as the per-layer benchmarks of bench/ (host_path.py,
torch_shapes.py) time it: F with bias, BD (the input needs a gradient) and BF, with a fixed output
gradient, and gradients set to None after, as zero_grad(set_to_none=True) does."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class Case:
    """One layer (keyword arguments of `layer`, nn.Conv2d by default) at one input shape and
    precision: its module, an input that needs a gradient, a fixed output gradient, and a
    training step of a module. `amp`: float16 channels-last input and module (channels_last_3d
    for 3-D layers; 1-D ones have none), run under autocast; else float32, packed."""

    def __init__(self, spec: dict, input_shape: tuple[int, ...], amp: bool, device: str = "cuda", seed: int = 0,
                 layer: type = nn.Conv2d):
        self.amp = amp
        self.device = torch.device(device)
        last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(input_shape), torch.contiguous_format)
        fmt = last if amp else torch.contiguous_format
        dtype = torch.float16 if amp else torch.float32
        torch.manual_seed(seed)
        self.module = layer(**spec).to(self.device).to(memory_format=fmt)
        self.x = torch.randn(input_shape, device=self.device, dtype=dtype).contiguous(memory_format=fmt)
        self.x.requires_grad_()
        with torch.no_grad(), self.autocast():
            self.dy = torch.randn_like(self.module(self.x))

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp)

    def forward(self, module: nn.Module) -> Tensor:
        with self.autocast():
            return module(self.x)

    def step(self, module: nn.Module) -> None:
        self.forward(module).backward(self.dy)
        self.clear(module)

    def outputs(self, module: nn.Module) -> dict[str, Tensor]:
        """y, dx, dw (and db where the layer has a bias) of one step of `module`."""
        y = self.forward(module)
        y.backward(self.dy)
        out = {"y": y.detach(), "dx": self.x.grad, "dw": module.weight.grad}
        if module.bias is not None:
            out["db"] = module.bias.grad
        self.clear(module)
        return out

    def clear(self, module: nn.Module) -> None:
        for p in (self.x, *module.parameters()):
            p.grad = None
