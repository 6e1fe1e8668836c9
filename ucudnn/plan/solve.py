"""How a plan is made, in one place (`plan`): the limit, the measurement tables of the kernels
within it (from a database or this GPU: the measuring passed in), one solve of them by WR (each
kernel alone, at the per-kernel limit) or WD (one ILP dividing one total), as the settings say.
The offline report (`ucudnn optimize`) and the handle's network solve both plan through it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..core.measurements import KernelTable
from ..core.problem import ConvProblem, Kernel, check_kernels
from ..core.staging import slices_of
from ..optimizers.configuration import Configuration
from ..optimizers.wd import WDResult, optimize_wd
from ..optimizers.wr import optimize_wr
from .config import Settings

# The measuring step: tables (by problem.key) of `problems`, complete within a cap of bytes (None:
# none), from a database or measured on this GPU (sources.tables_for, benchmark.ensure_tables)
Measure = Callable[[Sequence[ConvProblem], "int | None"], Mapping[str, KernelTable]]


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
          limit: int | None = None) -> Solution:
    """WR at settings.workspace_limit per kernel, or WD at settings.total(len(kernels)) with the
    settings' ILP solver; `limit` overrides either. `tables` holds each kernel's measurements by
    problem.key."""
    limit = settings.limit(len(kernels)) if limit is None else limit
    if not settings.optimizing.divides:
        return Solution({k.name: solve_wr(k, tables[k.problem.key], settings, limit) for k in kernels}, limit)
    result = optimize_wd(kernels, tables, settings.sizes, limit, solver=settings.solver)
    return Solution(result.configurations, limit, result)


@dataclass(frozen=True)
class Plan:
    """The kernels, their measurement tables and the solve's answer: what reports and the handle read."""

    kernels: tuple[Kernel, ...]
    tables: Mapping[str, KernelTable]
    solution: Solution


def plan(kernels: Sequence[Kernel], settings: Settings, measure: Measure, *, limit: int | None = None) -> Plan:
    """The steps of a plan, in order:
    1. the limit: per kernel (WR) or the network's total (WD), as the settings say, unless given;
    2. the measurement tables of the kernels within it: `measure` (a database, or this GPU);
    3. one solve by the settings' optimizer (WR: each kernel alone; WD: one ILP).
    Kernels that are not one plan's (problem.check_kernels: a name twice) are refused first,
    whatever the optimizer."""
    check_kernels(kernels)
    limit = settings.limit(len(kernels)) if limit is None else limit
    tables = measure([k.problem for k in kernels], limit)
    return Plan(tuple(kernels), tables, solve(kernels, tables, settings, limit))


def measured_in(tables: Mapping[str, KernelTable]) -> Measure:
    """The measuring step where the tables are at hand already (read from a database before)."""
    return lambda problems, cap: tables
