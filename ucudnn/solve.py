"""One solve: the configurations of a set of kernels from their measurement tables, by WR (each
kernel alone, at the per-kernel limit) or WD (one ILP dividing one total), as the settings say.
The handle's runtime assignments and the offline report both plan through it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .config import Settings
from .measurements import KernelTable
from .optimizers.configuration import Configuration
from .optimizers.wd import WDResult, optimize_wd
from .optimizers.wr import optimize_wr
from .problem import Kernel
from .staging import slices_of


@dataclass(frozen=True)
class Solution:
    configurations: dict[str, Configuration]  # by kernel name
    limit: int  # bytes: per kernel (WR) or in total (WD)
    wd: WDResult | None = None  # WD: the ILP's result, with the division of the buffer


def solve_wr(kernel: Kernel, table: KernelTable, settings: Settings, limit: int | None) -> Configuration:
    """WR: the kernel's fastest configuration within `limit` bytes (None: unlimited)."""
    p = kernel.problem
    return optimize_wr(table, p.batch, settings.sizes(p.batch), limit, kernel=kernel.name,
                       slices=slices_of(p))


def solve(kernels: Sequence[Kernel], tables: Mapping[str, KernelTable], settings: Settings,
          solver: str = "cbc", limit: int | None = None) -> Solution:
    """WR at settings.workspace_limit per kernel, or WD at settings.total_limit(len(kernels));
    `limit` overrides either. `tables` holds each kernel's measurements by problem.key."""
    limit = settings.limit(len(kernels)) if limit is None else limit
    if not settings.optimizing.divides:
        return Solution({k.name: solve_wr(k, tables[k.problem.key], settings, limit) for k in kernels}, limit)
    result = optimize_wd(kernels, tables, settings.sizes, limit, solver=solver)
    return Solution(result.configurations, limit, result)
