"""Any torchvision model as a Network: conv shapes traced from one dummy input with forward hooks.
Needs torch and torchvision, imported only when a model is traced."""
from __future__ import annotations

import importlib.util

from ..errors import ConfigError
from .layers import ConvLayer, Network


def missing_packages() -> list[str]:
    """Which of torch and torchvision tracing needs are not installed."""
    return [name for name in ("torch", "torchvision") if importlib.util.find_spec(name) is None]


def available() -> bool:
    return not missing_packages()


def model_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def trace(name: str, input_size: int = 224) -> Network:
    """The nn.Conv2d layers of torchvision model `name` on a 1 x 3 x input_size^2 input."""
    if not available():
        missing = " and ".join(missing_packages())
        raise ConfigError(f"network {name!r} needs torch and torchvision to trace, and {missing} "
                          f"{'is' if ' ' not in missing else 'are'} not installed; pip install {missing}")
    import torch
    import torchvision

    if name not in model_names():
        raise ConfigError(f"torchvision has no model {name!r}; `ucudnn nets` lists the built-in networks")
    model = torchvision.models.get_model(name, weights=None).eval()
    layers: list[ConvLayer] = []

    def record(module_name: str):
        def hook(module, inputs, output):
            if isinstance(module.padding, str):
                raise ConfigError(f"{name}.{module_name}: padding={module.padding!r} is not supported")
            layers.append(ConvLayer(module_name, module.in_channels, module.out_channels, module.kernel_size,
                                    tuple(inputs[0].shape[2:]), module.stride, module.padding,
                                    module.dilation, module.groups))
        return hook

    hooks = [module.register_forward_hook(record(module_name))
             for module_name, module in model.named_modules() if isinstance(module, torch.nn.Conv2d)]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, input_size, input_size))
    finally:
        for handle in hooks:
            handle.remove()
    return Network(name, tuple(layers), f"torchvision {name} (traced), {input_size}x{input_size}")
