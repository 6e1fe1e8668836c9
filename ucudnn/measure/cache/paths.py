"""Where benchmark databases live: the user's default file (or, on a network filesystem, its shard
folder), per-host and per-rank shards, the shipped recordings, and `cache_path`, the one rule that
picks among them."""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Literal, overload

from ...core.fallback import say_once
from ...core.ranks import current_rank
from ..variables import CACHE_VARIABLE, refuse_misnamed
from . import filesystems

RECORDINGS_PACKAGE = "ucudnn.recorded"  # the repository's cache/ folder, once installed
_CHECKOUT_RECORDINGS = Path(__file__).resolve().parents[3] / "cache"
SHARDS = "shards"  # the shard folder beside the default file, used where that is on a network filesystem
_said: set[Path] = set()  # the shard folders default_location has said it uses


@overload
def cache_path(path: str | os.PathLike | None = None, *, readonly: Literal[False] = False,
               env: Mapping[str, str] | None = None) -> Path: ...


@overload
def cache_path(path: str | os.PathLike | None = None, *, readonly: bool,
               env: Mapping[str, str] | None = None) -> Path | None: ...


def cache_path(path: str | os.PathLike | None = None, *, readonly: bool = False,
               env: Mapping[str, str] | None = None) -> Path | None:
    """The benchmark database to use: `path`, else $UCUDNN_CACHE, else the user's default
    (`default_location`) or, for `readonly` use, the newest shipped recording (None if none is
    shipped). A folder is a folder of shards."""
    env = os.environ if env is None else env
    refuse_misnamed(env)
    chosen = path or env.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    return recorded_path() if readonly else default_location()


def default_path() -> Path:
    """$XDG_CACHE_HOME/ucudnn/benchmarks.db, or ~/.cache/ucudnn/benchmarks.db without it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ucudnn" / "benchmarks.db"


def default_location() -> Path:
    """`default_path()`, or where its folder is on a network filesystem (filesystems.NETWORK_FILESYSTEMS),
    whose locks SQLite cannot trust across nodes, the shard folder `shards` beside it, made here and
    said once per process with a UcudnnWarning: each process then writes its own shard
    (`own_shard`), and reading commands merge them."""
    path, folder = default_path(), default_shard_folder()
    kind = filesystems.filesystem_type(path.parent)
    if kind not in filesystems.NETWORK_FILESYSTEMS:
        return path
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # the file, then, and its fault is the cache's to report
        return path
    if folder not in _said:
        _said.add(folder)
        say_once(f"ucudnn: the default benchmark database's folder {path.parent} is on a network filesystem "
                 f"({kind}), whose file locks SQLite cannot trust across nodes: each process writes its own "
                 f"shard in {folder} instead of sharing {path.name}, and reading commands given --cache "
                 f"{folder} merge them; set {CACHE_VARIABLE} to choose (`ucudnn cache --help`)")
    return folder


def default_shard_folder() -> Path:
    """The shard folder beside the default file (`shards`), which `default_location` uses on a
    network filesystem."""
    return default_path().parent / SHARDS


def shard_path(directory: str | os.PathLike, host: str | None = None, *, pid: int | None = None,
               rank: int | None = None) -> Path:
    """The shard file of one host (with `pid`, of one process; with `rank`, of one rank of a
    distributed job) in a shard directory: `<directory>/<host>.db`, `<directory>/<host>-<pid>.db`
    or `<directory>/<host>-rank<rank>.db`."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", host or socket.gethostname())
    suffix = f"-{pid}" if pid is not None else f"-rank{rank}" if rank is not None else ""
    return Path(directory) / f"{name}{suffix}.db"


def own_shard(directory: str | os.PathLike, env: Mapping[str, str] | None = None) -> Path:
    """This process's shard in a shard directory: its host's or, in a distributed job
    (ucudnn.core.ranks.current_rank, from `env` where given), its rank's, so that no two ranks write one
    file."""
    place = current_rank(env)
    return shard_path(directory, rank=place.rank if place.distributed else None)


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
