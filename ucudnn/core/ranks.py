"""This process's place in a distributed job: its rank, the job's number of processes and its rank
on its node.

torch.distributed's where its process group is up, else the variables the launcher sets (torchrun:
RANK, WORLD_SIZE, LOCAL_RANK). The one home of that rule: the benchmark database names a rank's
shard by it (ucudnn.measure.cache.paths.own_shard), and the torch integration's one plan per job is to pick
the rank that measures by it.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Rank:
    """A process's place in its job; `Rank()` is a process on its own."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        """Whether the job has other processes."""
        return self.world_size > 1


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "")
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"{name}={text!r} is not a rank or a number of processes: set it to an integer "
                          f"of 0 or more (torchrun sets it), or unset it")
    return int(text)


def current_rank(env: Mapping[str, str] | None = None) -> Rank:
    """This process's place: torch.distributed's where torch is imported and its process group is up
    (with `env` None), else from `env` (default os.environ): RANK, WORLD_SIZE (default RANK + 1) and
    LOCAL_RANK (default 0); a bad value raises ConfigError naming it."""
    distributed = sys.modules.get("torch.distributed") if env is None else None
    env = os.environ if env is None else env
    local = _number(env, "LOCAL_RANK", 0)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return Rank(distributed.get_rank(), distributed.get_world_size(), local)
    rank = _number(env, "RANK", 0)
    world_size = _number(env, "WORLD_SIZE", rank + 1)
    if rank >= world_size:
        raise ConfigError(f"RANK={rank} is not below WORLD_SIZE={world_size}: set them as torchrun does "
                          f"(ranks 0 to WORLD_SIZE - 1), or unset both")
    return Rank(rank, world_size, local)
