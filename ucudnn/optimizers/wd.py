"""WD (workspace division, paper III-C): the configurations of all kernels of a network that run
fastest together within one total workspace limit.

    minimize    sum_k count_k * sum_{c in D_k} t(k, c) x(k, c)
    subject to  sum_{c in D_k} x(k, c) = 1                   for every kernel k
                sum_k sum_{c in D_k} ws(k, c) x(k, c) <= M
                x(k, c) in {0, 1}

over the desirable sets D_k (pareto.py), which lose no optimum. Workspaces enter rounded up to
the segment alignment, so the divided buffer (workspace.py) never exceeds M.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pulp

from ..core.errors import InfeasibleError, NoAlgorithmError, UcudnnError
from ..core.measurements import KernelTable
from ..core.problem import Kernel, check_kernels
from ..core.staging import slices_of
from ..core.workspace import ALIGNMENT, Segment, align_up, divide
from .configuration import Configuration
from .pareto import desirable_sets
from .solvers import FIRST_INSTALLED, SOLVERS, solver_named, status_name, weighted_sum


@dataclass(frozen=True)
class WDResult:
    configurations: dict[str, Configuration]  # by kernel name, in the kernels' order
    total_time_ms: float  # sum of count x time
    total_workspace: int  # bytes of the divided buffer: the aligned sizes' sum, <= the limit
    variables: int  # binary variables of the ILP
    desirable_sizes: dict[str, int]  # configurations on each kernel's Pareto front within the limit
    build_seconds: float  # desirable sets and the model
    solve_seconds: float
    solver: str
    segments: dict[str, Segment]


@dataclass(frozen=True)
class Choice:
    """The ILP's answer: one option index per group, and what it took."""

    chosen: list[int]
    variables: int
    build_seconds: float
    solve_seconds: float


def optimize_wd(kernels: Sequence[Kernel], tables: Mapping[str, KernelTable],
                sizes: Iterable[int] | Callable[[int], Iterable[int]], total_limit: int,
                solver: str = FIRST_INSTALLED, alignment: int = ALIGNMENT) -> WDResult:
    """The fastest configurations of `kernels` (measured in `tables`, by problem.key) whose
    workspaces, each rounded up to `alignment`, sum to at most `total_limit` bytes. A kernel's
    `count` identical occurrences share one configuration and one segment (they never run at
    once); its time counts `count` times. `sizes`: the micro-batch sizes, or a function from a
    kernel's batch to them (e.g. functools.partial(batch_sizes, "powerOfTwo")). `solver`: a name
    of solvers.SOLVERS; by default the first installed."""
    solver = solver_named(solver)
    check_kernels(kernels)
    start = time.perf_counter()
    options = _desirable(kernels, tables, sizes, total_limit, alignment)
    desirable_seconds = time.perf_counter() - start
    choice = choose([[(k.count * c.time_ms, align_up(c.workspace, alignment)) for c in d]
                     for k, d in zip(kernels, options)], total_limit, SOLVERS[solver].make())
    configurations = {k.name: d[i] for k, d, i in zip(kernels, options, choice.chosen)}
    segments, buffer = divide({n: c.workspace for n, c in configurations.items()}, alignment)
    return WDResult(
        configurations=configurations,
        total_time_ms=sum(k.count * configurations[k.name].time_ms for k in kernels),
        total_workspace=buffer,
        variables=choice.variables,
        desirable_sizes={k.name: len(d) for k, d in zip(kernels, options)},
        build_seconds=desirable_seconds + choice.build_seconds,
        solve_seconds=choice.solve_seconds,
        solver=solver,
        segments=segments,
    )


def _desirable(kernels: Sequence[Kernel], tables: Mapping[str, KernelTable], sizes, limit: int,
               alignment: int) -> list[list[Configuration]]:
    """Each kernel's desirable configurations whose aligned workspace fits `limit`, with at most
    one per aligned workspace. NoAlgorithmError / InfeasibleError when a kernel has none."""
    every = None if callable(sizes) else tuple(sizes)
    batches = [k.problem.batch for k in kernels]
    problems = [(tables[k.problem.key], b, sizes(b) if every is None else every) for k, b in zip(kernels, batches)]
    slices = [slices_of(k.problem) for k in kernels]
    sets = desirable_sets(problems, limit // alignment * alignment, slices)
    if all(sets):
        return [_aligned(d, alignment) for d in sets]
    unlimited = desirable_sets(problems, None, slices)  # only to say what would fit
    for k, d in zip(kernels, unlimited):
        if not d:
            raise NoAlgorithmError(
                f"kernel {k.name!r} has no available algorithm at micro-batch sizes that sum to "
                f"its batch {k.problem.batch}; benchmark it, or use a batch size policy with more sizes")
    raise InfeasibleError(limit, sum(align_up(d[0].workspace, alignment) for d in unlimited))


def _aligned(front: list[Configuration], alignment: int) -> list[Configuration]:
    """Of configurations with the same workspace once aligned, the fastest (the last)."""
    size = [align_up(c.workspace, alignment) for c in front]
    return [c for i, c in enumerate(front) if i + 1 == len(front) or size[i + 1] > size[i]]


def choose(options: Sequence[Sequence[tuple[float, int]]], capacity: int,
           solver: pulp.LpSolver) -> Choice:
    """The 0-1 ILP: one (cost, weight) option of every group, total weight <= capacity, least
    total cost. InfeasibleError when even the lightest options exceed the capacity."""
    start = time.perf_counter()
    lightest = [min(w for _, w in group) for group in options]
    if sum(lightest) > capacity:
        raise InfeasibleError(capacity, sum(lightest))
    slack = capacity - sum(lightest)
    # an option heavier than its group's lightest by more than the slack can never be chosen
    usable = [[i for i, (_, w) in enumerate(group) if w - light <= slack]
              for group, light in zip(options, lightest)]
    # weights in units of their gcd keep the coefficients small; exact, as sums stay multiples
    unit = math.gcd(*(w for group in options for _, w in group)) or 1
    problem = pulp.LpProblem("wd", pulp.LpMinimize)
    x = [{i: _binary(problem, f"x_{g}_{i}") for i in keep}
         for g, keep in enumerate(usable)]
    problem += weighted_sum((v, options[g][i][0]) for g, xs in enumerate(x) for i, v in xs.items())
    for g, xs in enumerate(x):
        problem += pulp.lpSum(xs.values()) == 1, f"one_{g}"
    problem += weighted_sum(
        (v, options[g][i][1] // unit) for g, xs in enumerate(x) for i, v in xs.items()
    ) <= capacity // unit, "workspace"
    built = time.perf_counter()
    status = status_name(problem.solve(solver))
    solved = time.perf_counter()
    if status != "Optimal":
        raise UcudnnError(f"the ILP solver {solver.name} ended with status {status}")
    chosen = [max(xs, key=lambda i: xs[i].value() or 0) for xs in x]
    if sum(options[g][i][1] for g, i in enumerate(chosen)) > capacity:  # beyond solver tolerances
        raise UcudnnError(f"the ILP solver {solver.name} returned a solution over the capacity")
    return Choice(chosen, sum(map(len, x)), built - start, solved - built)


def _binary(problem: pulp.LpProblem, name: str) -> pulp.LpVariable:
    if hasattr(problem, "add_variable"):  # PuLP >= 3.3, which deprecates LpVariable(...)
        return problem.add_variable(name, cat=pulp.LpBinary)
    return pulp.LpVariable(name, cat=pulp.LpBinary)


def breakdown_table(result: WDResult, names: Sequence[str] | None = None,
                    algo_name: Callable[[str, str], str] | None = None) -> str:
    """The division as a plain-text table (the paper's Fig. 14): per kernel, in `names` order
    (default: the kernels'), its configuration, time per run, workspace and share of the buffer.
    `algo_name(kernel name, candidate)` names candidates (default: their ids)."""
    names = list(result.configurations) if names is None else list(names)
    buffer = result.total_workspace or 1
    rows = [("kernel", "configuration", "time ms", "workspace MiB", "share %")]
    for name in names:
        c = result.configurations[name]
        label = c.describe(functools.partial(algo_name, name)) if algo_name else c.describe()
        rows.append((name, label, f"{c.time_ms:.3f}", f"{c.workspace / 2**20:.2f}",
                     f"{100 * c.workspace / buffer:.1f}"))
    rows.append(("total", "time weighted by count", f"{result.total_time_ms:.3f}",
                 f"{result.total_workspace / 2**20:.2f}", "100.0"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows)
