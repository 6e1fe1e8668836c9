"""When a converted layer runs torch's own convolution instead (delegation).

A converted call costs host time that torch's own does not: a Python autograd Function, the
site lookup, a graph launch per kernel. In a training step that the host paces (ResNet-50 in
AMP: 53 short convolutions) that time is the step's time. So ucudnn takes a layer only where it
buys something: where torch's own kernels need more workspace than the limit allows (the reason
ucudnn exists: they are not allowed to run), or where ucudnn's kernels are faster than torch's by
more than the host time a converted step costs. Otherwise the layer runs torch's own
convolution, with no cost beyond one lookup. Both sides are measured in this process: ucudnn's
kernels by its benchmark, torch's by timing its own convolution once per kernel (under the memory
free then, as torch's benchmark mode sees it).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from .kernels import TorchTiming

# What a converted F+BD+BF step costs the host beyond torch's own layer, in ms: 0.35-0.49 ms
# synced vs torch's 0.04-0.17 ms per AlexNet layer, and 4.6 ms over ResNet-50's 53 layers in AMP
# (~0.09 ms a layer) on the H100's host (docs/torch.md). The smaller figure keeps ucudnn on a
# layer wherever its kernels win clearly.
HOST_COST_MS = 0.05


# Free memory (device free plus torch's cached blocks) beyond which torch's benchmark mode is taken
# to have had every plan cuDNN offers within reach. A judgment, not a measured bound: a plan asking
# more than this for one convolution would be kept from torch unnoticed (docs/results.md, "Cold
# start on models nobody planned", says what is not yet measured).
ROOMY_BYTES = 4 * 2**30


def settled_by_torch(torch: Sequence[TorchTiming], limit: int, favourites_fit: Callable[[], bool]) -> bool:
    """Whether a layer runs torch's own convolution with no sweep of ucudnn's candidates: each of
    its torch kernels was timed (its operands fit) and fits the per-kernel workspace `limit`, and
    torch chose it with nothing out of reach: with ROOMY_BYTES free, or else where cuDNN's
    heuristic favourite of each kernel fits the limit too (`favourites_fit()`, asked only then:
    it costs a heuristics query per kernel). Then no plan is kept out by the limit, which is all
    micro-batching can let in, and torch's benchmark mode has timed what cuDNN rates best. Under
    memory pressure with a favourite that does not fit (torch settled for a slow plan), the
    sweep decides."""
    if not torch or any(t.ms == math.inf or t.workspace > limit for t in torch):
        return False
    return all(t.free >= ROOMY_BYTES for t in torch) or favourites_fit()


def torch_kernel_faster(ucudnn_ms: float, torch: TorchTiming, limit: int) -> bool:
    """Whether one kernel of a layer ucudnn keeps runs torch's own convolution instead: torch's
    kernel was timed, fits the per-kernel workspace `limit` and is faster than ucudnn's plan (a
    plan the search could not find: a pruned search times cuDNN's best-ranked candidates, and
    torch's benchmark mode may find another that ranks lower)."""
    return torch.ms < ucudnn_ms and torch.workspace <= limit


def worth_delegating(ucudnn_ms: Sequence[float], torch: Sequence[TorchTiming], limit: int,
                     host_cost_ms: float = HOST_COST_MS) -> bool:
    """Whether a layer whose kernels take `ucudnn_ms` through ucudnn and `torch` (time and
    workspace) through torch runs torch's own convolution: every torch kernel fits the per-kernel
    workspace `limit`, and ucudnn's kernels together save less than `host_cost_ms`."""
    if not torch or any(t.workspace > limit for t in torch):
        return False
    saving_ms = sum(t.ms for t in torch) - sum(ucudnn_ms)
    return saving_ms < host_cost_ms
