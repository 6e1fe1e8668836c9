"""One plan per job under torch.distributed: rank 0 plans first and keeps what it measured in the
benchmark database the ranks share (docs/cache.md, "Sharing one cache among processes and
nodes"); the other ranks plan after it, from those measurements, timing nothing that rank 0
timed. See docs/torch.md, "Several processes: torch.distributed"."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

Result = TypeVar("Result")


def rank_zero_first(plan: Callable[[], Result]) -> Result:
    """`plan()` on rank 0 of torch.distributed's default group, then, after a barrier, on every
    other rank; without an initialized process group, plan() alone. `plan` plans the model's
    layers with no collective inside: eager steps of the model unwrapped (not yet in
    DistributedDataParallel), then Context.plan_pending()."""
    if not (dist.is_available() and dist.is_initialized()):
        return plan()
    if dist.get_rank() == 0:
        result = plan()
        dist.barrier()
        return result
    dist.barrier()
    return plan()
