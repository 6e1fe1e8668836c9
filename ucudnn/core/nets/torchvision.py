"""torchvision models as Networks: conv shapes traced from one dummy input with forward hooks.

Tracing needs torch and torchvision (seconds of imports), so the tables of common
models ship traced (torchvision.json, written by `python3 -m ucudnn.core.nets.torchvision` where torch
and torchvision are installed; a test checks them against a fresh trace there). Other models are
traced on demand."""
from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

from ..errors import ConfigError
from .layers import ConvLayer, Network

SHIPPED = Path(__file__).with_name("torchvision.json")
INPUT_SIZE = 224
# the models shipped traced: the common ones a user names
COMMON = ("alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "googlenet", "inception_v3", "mnasnet1_0",
          "mobilenet_v2", "mobilenet_v3_large", "regnet_y_400mf", "resnet18", "resnet34", "resnet50", "resnet101",
          "resnet152", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_0", "vgg11", "vgg16", "vgg19",
          "wide_resnet50_2")


def missing_packages() -> list[str]:
    """Which of torch and torchvision tracing needs are not installed."""
    return [name for name in ("torch", "torchvision") if importlib.util.find_spec(name) is None]


def available() -> bool:
    return not missing_packages()


def model_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


@functools.lru_cache(maxsize=1)
def shipped_tables() -> dict:
    """{"torchvision": version traced with, "input_size": ..., "networks": {name: network JSON}}."""
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def shipped_names() -> list[str]:
    return sorted(shipped_tables()["networks"])


def network(name: str) -> Network:
    """Model `name`'s table: the shipped one where there is one, else traced now."""
    found = shipped_tables()["networks"].get(name)
    return Network.from_json(found) if found is not None else trace(name)


def trace(name: str, input_size: int = INPUT_SIZE) -> Network:
    """The nn.Conv2d layers of torchvision model `name` on a 1 x 3 x input_size^2 input."""
    if not available():
        missing = " and ".join(missing_packages())
        raise ConfigError(f"network {name!r} is not among the shipped torchvision tables "
                          f"({', '.join(shipped_names())}) and tracing it needs torch and torchvision; {missing} "
                          f"{'is' if ' ' not in missing else 'are'} not installed: pip install {missing}")
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


def tables(names: list[str]) -> dict:
    """The shipped file's content for models `names`, traced now."""
    import torchvision

    return {"torchvision": torchvision.__version__, "input_size": INPUT_SIZE,
            "networks": {name: trace(name).to_json() for name in names}}


def write_shipped(path: Path = SHIPPED) -> dict:
    """Trace the COMMON models into `path` (the shipped file by default); its content."""
    content = tables(list(COMMON))
    path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return content


if __name__ == "__main__":
    print(f"{len(COMMON)} tables (torchvision {write_shipped()['torchvision']}) -> {SHIPPED}")
