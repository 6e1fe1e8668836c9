"""Finding libcudnn.so.9: the one already in the process (so ucudnn shares torch's), then
UCUDNN_CUDNN_LIBRARY, then the nvidia-cudnn wheels, then the system's loader path."""
from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

from ...core.errors import LibraryNotFoundError, gpu_install

SONAME = "libcudnn.so.9"


def mapped(soname: str = SONAME) -> dict[tuple[str, str], str]:
    """The files named `soname`* mapped into this process: (device, inode) -> path."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return {}
    found: dict[tuple[str, str], str] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name.startswith(soname):
            found.setdefault((fields[3], fields[4]), fields[5])
    return found


def _already_loaded() -> str | None:
    return next(iter(mapped().values()), None)


def copies_loaded() -> int:
    """How many distinct libcudnn.so.9 files this process has mapped. A cuDNN handle belongs to
    the library that made it: it can pass between callers (ucudnn's bindings, the frontend)
    only where there is one."""
    return len(mapped())


def _wheel() -> str | None:
    for package in ("nvidia.cudnn",):
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(root) / "lib" / SONAME
            if candidate.exists():
                return str(candidate)
    return None


def candidates() -> list[tuple[str, str]]:
    """(where it came from, path or soname) in the order they are tried."""
    found = [("loaded in this process", _already_loaded()),
             ("UCUDNN_CUDNN_LIBRARY", os.environ.get("UCUDNN_CUDNN_LIBRARY")),
             ("nvidia-cudnn wheel", _wheel()),
             ("system loader path", SONAME)]
    return [(origin, path) for origin, path in found if path]


def load() -> tuple[ctypes.CDLL, str]:
    """The cuDNN library and the path it was loaded from."""
    errors = []
    for origin, path in candidates():
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        except OSError as exc:
            if origin == "UCUDNN_CUDNN_LIBRARY":
                raise LibraryNotFoundError(
                    f"UCUDNN_CUDNN_LIBRARY={path!r} could not be loaded ({exc}); point it at a libcudnn.so.9"
                ) from exc
            errors.append(f"{origin}: {exc}")
    raise LibraryNotFoundError(
        "cuDNN 9 was not found (" + "; ".join(errors) + f"). Install it with `{gpu_install()}`, "
        "or set UCUDNN_CUDNN_LIBRARY to libcudnn.so.9"
    )
