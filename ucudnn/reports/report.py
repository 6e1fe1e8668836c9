"""The offline report of a whole network: the WR or WD configuration of every kernel (by
solve.solve, as the handle plans at run time), beside the two references that say what it buys:
cuDNN undivided at the same per-kernel limit (what cuDNN itself would pick) and undivided with
no limit (the best cuDNN can do with unbounded memory).

Pure CPU: kernels and their measurement tables in, a Report out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.nets import find_kernel
from ..core.problem import Kernel
from ..optimizers import OPTIMIZERS, Optimizer
from ..optimizers.configuration import Configuration
from ..optimizers.wr import optimize_wr
from ..plan import solve
from ..plan.config import Settings


@dataclass(frozen=True)
class KernelReport:
    kernel: Kernel
    configuration: Configuration  # the one solve() chose
    undivided: Configuration  # cuDNN's pick at the same per-kernel limit
    best: Configuration  # undivided, unlimited workspace

    @property
    def speedup(self) -> float:
        return self.undivided.time_ms / self.configuration.time_ms

    def describe(self, configuration: Configuration) -> str:
        return configuration.describe()


def _configuration_json(row: KernelReport, configuration: Configuration) -> dict:
    return {"time_ms": configuration.time_ms, "workspace": configuration.workspace,
            "description": row.describe(configuration),
            "micro": configuration.to_json()}


@dataclass(frozen=True)
class Report:
    optimizer: str  # its name (ucudnn.optimizers)
    policy: str
    limit: int  # bytes: per kernel (WR) or for the whole network (WD)
    kernel_limit: int  # bytes each kernel gets in the undivided reference
    rows: tuple[KernelReport, ...]
    workspace: int  # bytes the chosen configurations allocate in all (WD: the divided buffer, aligned)
    solver: dict | None = None  # WD: the ILP's size and timings

    @property
    def optimizing(self) -> Optimizer:
        return OPTIMIZERS[self.optimizer]

    def time_ms(self, which: str = "configuration") -> float:
        """Predicted time of every kernel once per occurrence: of the chosen configurations, or of the
        "undivided" or "best" reference."""
        return sum(row.kernel.count * getattr(row, which).time_ms for row in self.rows)

    def reference_workspace(self, which: str) -> int:
        """Bytes a reference allocates: one workspace per distinct kernel, as ucudnn's handle does
        (identical layers never run at once, so they share one)."""
        return sum(getattr(row, which).workspace for row in self.rows)

    @property
    def speedup(self) -> float:
        """Over cuDNN undivided at the same limit."""
        return self.time_ms("undivided") / self.time_ms()

    @property
    def gap_to_best(self) -> float:
        """The chosen time over the unlimited best's: 1.0 means nothing is left to gain."""
        return self.time_ms() / self.time_ms("best")

    def row(self, name: str) -> KernelReport:
        kernel = find_kernel([row.kernel for row in self.rows], name)
        return next(row for row in self.rows if row.kernel == kernel)

    def slowest(self) -> KernelReport:
        """The kernel that takes the most of the chosen time."""
        return max(self.rows, key=lambda row: row.kernel.count * row.configuration.time_ms)

    def most_improved(self) -> KernelReport:
        """The kernel whose plan saves the most time over cuDNN undivided (every occurrence);
        of equal savings (none anywhere, say), the slowest."""
        return max(self.rows, key=lambda row: (row.kernel.count * (row.undivided.time_ms - row.configuration.time_ms),
                                               row.kernel.count * row.configuration.time_ms))

    def to_json(self) -> dict:
        return {
            "optimizer": self.optimizer, "policy": self.policy, "limit": self.limit,
            "kernel_limit": self.kernel_limit, "solver": self.solver,
            "kernels": [{
                "name": row.kernel.name, "layer": row.kernel.layer, "kind": row.kernel.problem.kind.value,
                "count": row.kernel.count, "problem": row.kernel.problem.to_dict(),
                "speedup": row.speedup,
                **{which: _configuration_json(row, getattr(row, which))
                   for which in ("configuration", "undivided", "best")},
            } for row in self.rows],
            "total": {
                "time_ms": self.time_ms(), "workspace": self.workspace,
                "undivided_time_ms": self.time_ms("undivided"),
                "undivided_workspace": self.reference_workspace("undivided"),
                "best_time_ms": self.time_ms("best"), "best_workspace": self.reference_workspace("best"),
                "speedup": self.speedup, "gap_to_best": self.gap_to_best,
            },
        }


def make_report(planned: solve.Plan, settings: Settings) -> Report:
    """The plan (solve.plan) beside the references: cuDNN undivided at the per-kernel limit (WD:
    an equal share of its total) and undivided with no limit. The plan's tables hold each
    kernel's measurements complete for the policy's sizes within the limit and for the whole
    batch with none (sources.complete_tables)."""
    kernels, tables, solution = planned.kernels, planned.tables, planned.solution
    kernel_limit = solution.limit // len(kernels) if settings.optimizing.divides else solution.limit
    if solution.wd is None:
        workspace, solver_stats = sum(c.workspace for c in solution.configurations.values()), None
    else:
        result = solution.wd
        workspace = result.total_workspace
        solver_stats = {"solver": result.solver, "variables": result.variables,
                        "build_seconds": result.build_seconds, "solve_seconds": result.solve_seconds}
    batch = kernels[0].problem.batch
    rows = tuple(KernelReport(
        k, solution.configurations[k.name],
        undivided=optimize_wr(tables[k.problem.key], batch, (batch,), kernel_limit, kernel=k.name),
        best=optimize_wr(tables[k.problem.key], batch, (batch,), None, kernel=k.name),
    ) for k in kernels)
    return Report(settings.optimizer, settings.policy, solution.limit, kernel_limit, rows, workspace,
                  solver_stats)
