"""Networks by name: the built-in tables, network files (JSON) and traced torchvision models."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import ConfigError
from . import torchvision
from .builtin import BUILTIN
from .layers import ConvLayer, Kernel, Network, find_kernel, merge_identical

__all__ = ["ConvLayer", "Kernel", "Network", "find_kernel", "get_network", "list_networks", "load_network",
           "merge_identical"]

TORCHVISION_PREFIX = "torchvision:"


def list_networks() -> list[Network]:
    """The built-in networks."""
    return [build() for build in BUILTIN.values()]


def get_network(name_or_path: str) -> Network:
    """A built-in network ("alexnet", "ResNet-50", ...), a network file ("my_net.json"), or a
    torchvision model ("vgg16", or "torchvision:resnet50" for torchvision's rather than the
    built-in table): shipped traced for common models, traced where torchvision is installed."""
    if name_or_path.lower().endswith(".json"):
        return load_network(name_or_path)
    if name_or_path.startswith(TORCHVISION_PREFIX):
        return torchvision.network(name_or_path[len(TORCHVISION_PREFIX):])
    key = re.sub(r"[^a-z0-9]", "", name_or_path.lower())
    if key in BUILTIN:
        return BUILTIN[key]()
    if name_or_path in torchvision.shipped_names() or torchvision.available():
        return torchvision.network(name_or_path)
    raise ConfigError(
        f"unknown network {name_or_path!r}; use one of {', '.join(BUILTIN)}, a network file NAME.json, "
        f"or a torchvision model: one of the {len(torchvision.shipped_names())} shipped (`ucudnn nets` lists "
        "them), any other with torch and torchvision installed"
    )


def load_network(path: str | Path) -> Network:
    """A network file: {"name": ..., "description": ..., "layers": [{"name": ..., ...}, ...]}."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))  # a byte order mark, if any, is no text
    except FileNotFoundError:
        raise ConfigError(f"network file {path} does not exist; check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"network file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); save it as UTF-8 JSON") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"network file {path} cannot be read: {exc}") from None
    try:
        return Network.from_json(data)
    except (TypeError, ValueError) as exc:  # ConfigError is a ValueError
        raise ConfigError(f"network file {path}: {exc}") from None
