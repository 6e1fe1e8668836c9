"""WD's memory-aware total (total_limit="auto"): a share of the memory the training step leaves free.

When a model nearly fills the GPU, no fixed workspace limit is right for every run. With
`convert(model, optimizer="wd", total_limit="auto")` the first iteration runs torch's own
convolutions while the layers record their kernels. When the second iteration starts, torch's
unused cached blocks go back to the device and WD divides AUTO_SHARE of what stays free when
tensors again take their peak (torch's own peak statistic, which covers the first iteration):

    available = free on the device - (tensor peak - in use now)
    total     = AUTO_SHARE x available

What torch still holds beyond its tensors after that is fragments, which cannot hold one large
buffer: not counted. The other half is margin for torch's allocator. The peak is torch's since
the process started (or since the caller last called torch.cuda.reset_peak_memory_stats()):
conservative where something before training held more. (Peaks sampled at layer boundaries
missed the classifier's gradients, and counting the fragments ran out of memory in torch's own
backward under 128 MiB of headroom, on the H100.) The workspace is one buffer from torch's
caching allocator; if it cannot be had the network is solved again within half of it
(ucudnn.assignment).
"""
from __future__ import annotations

from typing import NamedTuple

AUTO = "auto"  # the total_limit that asks for this
AUTO_SHARE = 0.5


class Memory(NamedTuple):
    """One device's memory at one moment, in bytes."""

    free: int  # free on the device (cudaMemGetInfo): nobody holds it
    allocated: int  # held by torch's tensors


def auto_total(now: Memory, tensor_peak: int, share: float = AUTO_SHARE) -> int:
    """WD's total in bytes: `share` of the memory that stays free when tensors again take
    `tensor_peak` bytes, given the memory `now` (settled: torch's unused cached blocks given back)."""
    growth = max(0, tensor_peak - now.allocated)
    return max(0, int(share * (now.free - growth)))
