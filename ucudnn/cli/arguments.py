"""Argument types of the command line: a bad value gets a one-line message that names it and the fix."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import CacheError, ConfigError
from ..core.problem import INT64_MAX
from ..measure.cache.paths import default_path, default_shard_folder, own_shard
from ..measure.parallel.devices import parse_devices
from ..plan.config import choice, parse_size
from ..reports.plots import check_plot_path


def batch_size(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer from 1 to 2**63 - 1; give the mini-batch "
                                         "size, e.g. 256")
    return int(text)


def setting(choices: tuple[str, ...]):
    """The type of a flag that sets a setting: read as its UCUDNN_* variable is, in any case."""
    def one_of(text: str) -> str:
        try:
            return choice(text, choices)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return one_of


def byte_size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def device_list(text: str) -> list[int]:
    try:
        return parse_devices(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


STDOUT = "-"  # the file name of standard output


def output_file(text: str, example: str = "out.json") -> Path:
    """A file to write: its folder exists and the file can be written there (tried: permissions
    do not say it of root, nor of /proc); a folder is refused, suggesting `example` in it."""
    path = Path(text)
    folder = path.parent
    if not text:
        raise argparse.ArgumentTypeError(f"an empty path names no file; give one such as {example}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name such as {path / example}")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} does not exist; create it first")
    try:
        _try_writing(path)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {(exc.strerror or str(exc)).lower()}; "
                                         "choose a writable path") from None
    return path


def _try_writing(path: Path) -> None:
    """Open `path` for writing as the command will, changing nothing: an existing file is opened
    to append (nothing is written), a new one is made and removed again."""
    if path.exists():
        with open(path, "a"):
            return
    with open(path, "x"):
        pass
    path.unlink()


def output_folder(text: str) -> Path:
    """A folder to write files into, made where missing: no file may stand at its path, nor at a
    folder above it."""
    path = Path(text)
    existing = next((place for place in (path, *path.parents) if place.exists()), path)
    if existing.exists() and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {existing} is a file, not a folder; name a "
                                         "folder (made where missing), e.g. docs/paper")
    return path


def export_file(text: str) -> Path | str:
    """The file `cache export` writes: STDOUT, or a file to write."""
    return text if text == STDOUT else output_file(text)


def cache_file(text: str) -> str:
    """--cache: any path but an empty one (which would mean the default silently)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no database; give a file (e.g. benchmarks.db), "
                                         "or leave --cache out for the default")
    return text


def existing_file(what: str):
    """The type of an argument that names a file to read, called `what` in messages."""
    def existing(text: str) -> Path:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{what} {text} is a folder; name a file")
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{what} {text} does not exist; check the path")
        return path
    return existing


def database_file(text: str) -> Path:
    return output_file(text, "benchmarks.db")


def plot_file(text: str) -> Path:
    path = output_file(text, "plot.png")
    try:
        check_plot_path(path)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return path


def target(path) -> Path:
    """A database a command writes into, checked as any output file is (its folder must exist);
    only ucudnn's own default folder is made, and its shard folder (the default on a network
    filesystem, paths.default_location) means this process's shard in it."""
    if Path(path) == default_path():
        return Path(path)
    if Path(path) == default_shard_folder():
        return own_shard(path)
    try:
        return database_file(str(path))
    except argparse.ArgumentTypeError as exc:
        raise CacheError(str(exc)) from None
