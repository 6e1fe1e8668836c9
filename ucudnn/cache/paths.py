"""Where benchmark databases live: the user's default file, per-host shards, the shipped recordings,
and `cache_path`, the one rule that picks among them."""
from __future__ import annotations

import os
import re
import socket
from importlib import resources
from pathlib import Path
from typing import Mapping

RECORDINGS_PACKAGE = "ucudnn.recorded"  # the repository's cache/ folder, once installed
_CHECKOUT_RECORDINGS = Path(__file__).resolve().parents[2] / "cache"
CACHE_VARIABLE = "UCUDNN_CACHE"


def cache_path(path: str | os.PathLike | None = None, *, readonly: bool = False,
               env: Mapping[str, str] | None = None) -> Path | None:
    """The benchmark database to use: `path`, else $UCUDNN_CACHE, else the user's default file
    or, for `readonly` use, the newest shipped recording (None if none is shipped)."""
    env = os.environ if env is None else env
    chosen = path or env.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    return recorded_path() if readonly else default_path()


def default_path() -> Path:
    """$XDG_CACHE_HOME/ucudnn/benchmarks.db, or ~/.cache/ucudnn/benchmarks.db without it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ucudnn" / "benchmarks.db"


def shard_path(directory: str | os.PathLike, host: str | None = None, *, pid: int | None = None) -> Path:
    """The shard file of one host (and, with `pid`, of one process) in a shard directory:
    `<directory>/<host>.db` or `<directory>/<host>-<pid>.db`."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", host or socket.gethostname())
    return Path(directory) / (f"{name}-{pid}.db" if pid is not None else f"{name}.db")


def shard_paths(directory: str | os.PathLike) -> list[Path]:
    """The shard files of a shard directory (every `*.db` in it), by name."""
    return sorted(Path(directory).glob("*.db"))


def _recordings_dir() -> Path:
    if (_CHECKOUT_RECORDINGS / "__init__.py").is_file():  # this source checkout's, not an installed copy's
        return _CHECKOUT_RECORDINGS
    try:
        return Path(str(resources.files(RECORDINGS_PACKAGE)))
    except ModuleNotFoundError:  # a source checkout: the package exists only once installed
        return _CHECKOUT_RECORDINGS


def _natural(path: Path) -> list:
    """Sort key that orders 'h100-cudnn91900' before 'h100-cudnn100100'."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def recorded_paths() -> list[Path]:
    """The shipped databases of real measurements, oldest first: names sort naturally,
    so `<gpu>-cudnn<version>.db` files of one GPU come in cuDNN version order."""
    directory = _recordings_dir()
    return sorted(directory.glob("*.db"), key=_natural) if directory.is_dir() else []


def recorded_path() -> Path | None:
    """The newest shipped database (the last of `recorded_paths()`), None if none is shipped."""
    paths = recorded_paths()
    return paths[-1] if paths else None
