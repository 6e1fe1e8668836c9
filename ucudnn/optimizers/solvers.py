"""The MIP solvers WD's ILP runs on (wd.py), by the name the `solver` setting gives, in the order
they are preferred: the setting unset ("") means the first one installed. Each runs without a
relative gap, so that the answer is optimal, not merely close.

Written for PuLP 3 and 4 alike: CBC runs through COIN_CMD, which both have (PuLP 4 removes
PULP_CBC_CMD and no longer bundles a CBC binary); the model is read through `weighted_sum`
and `status_name`, which take either's API."""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pulp

from ..core.errors import ConfigError, unknown

try:  # the CBC binary PuLP 3 bundles
    from pulp.apis.coin_api import pulp_cbc_path as BUNDLED_CBC
except ImportError:
    BUNDLED_CBC = None

FIRST_INSTALLED = ""  # the solver setting that takes the first installed of SOLVERS


def _cbc() -> pulp.LpSolver:
    """CBC through COIN_CMD: a `cbc` on the PATH (a system package such as coinor-cbc) or, with
    PuLP 4, cbcbox's (`pip install 'pulp[cbc]'`), else the binary PuLP 3 bundles."""
    installed = pulp.COIN_CMD(msg=False, gapRel=0)
    if installed.available() or BUNDLED_CBC is None:
        return installed
    return pulp.COIN_CMD(msg=False, gapRel=0, path=BUNDLED_CBC)


def _highs() -> pulp.LpSolver:
    """HiGHS through highspy, its banner kept off stdout (_banner_taken)."""
    solver = pulp.HiGHS(msg=False, gapRel=0)
    if solver.available():
        _banner_taken()
    return solver


@functools.cache
def _banner_taken() -> None:
    """highspy writes a banner on the process's standard output (its file descriptor, past
    sys.stdout) at the first Highs() a process makes, whatever the options: that one is made with
    the descriptor on /dev/null, so that what a command prints (its JSON) stays its own."""
    import highspy

    sys.stdout.flush()
    try:
        kept = os.dup(1)
    except OSError:  # no standard output to keep clean
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(kept, 1)
        os.close(kept)


@dataclass(frozen=True)
class Solver:
    """A solver of the registry: its name, how PuLP makes it, and how to install it."""

    name: str
    make: Callable[[], pulp.LpSolver]
    install: str  # for the error of a solver that is not installed

    def installed(self) -> bool:
        return self.make().available()


SOLVERS: dict[str, Solver] = {s.name: s for s in (
    Solver("cbc", _cbc, "a cbc binary, which PuLP 3 bundles; with PuLP 4, pip install 'pulp[cbc]' or a "
                        "system package such as coinor-cbc"),
    Solver("highs", _highs, "highspy, a dependency of ucudnn: pip install highspy"),
    Solver("glpk", lambda: pulp.GLPK_CMD(msg=False), "glpsol on the PATH, from a system package such as glpk-utils"),
)}


def available_solvers() -> list[str]:
    """The names of the solvers installed here, the preferred first."""
    return [name for name, solver in SOLVERS.items() if solver.installed()]


def solver_named(name: str = FIRST_INSTALLED) -> str:
    """The installed solver `name` names (in any case), or for FIRST_INSTALLED the first installed;
    ConfigError naming the solver and how to install it where it is unknown or not installed."""
    if name == FIRST_INSTALLED:
        installed = available_solvers()
        if not installed:
            raise ConfigError("no ILP solver for WD is installed: " + "; ".join(
                f"{s.name} needs {s.install}" for s in SOLVERS.values()))
        return installed[0]
    solver = SOLVERS.get(str(name).lower())
    if solver is None:
        raise unknown(name, tuple(SOLVERS), "solver")
    if not solver.installed():
        raise ConfigError(f"ILP solver {name!r} is not installed: it needs {solver.install}; "
                          f"installed: {', '.join(available_solvers()) or 'none'}")
    return solver.name


def make_solver(name: str = FIRST_INSTALLED) -> pulp.LpSolver:
    """The PuLP solver `name` names (solver_named)."""
    return SOLVERS[solver_named(name)].make()


def weighted_sum(terms: Iterable[tuple[pulp.LpVariable, float]]) -> pulp.LpAffineExpression:
    """The sum of coefficient x variable over `terms`: PuLP 4 builds it with from_list, PuLP 3
    with the constructor."""
    build = getattr(pulp.LpAffineExpression, "from_list", pulp.LpAffineExpression)
    return build(list(terms))


def status_name(solved) -> str:
    """The status of a solve as a word ("Optimal"): PuLP 4's solve() returns an LpSolveStats,
    PuLP 3's the status code."""
    return solved.status_str if hasattr(solved, "status_str") else pulp.LpStatus[solved]
