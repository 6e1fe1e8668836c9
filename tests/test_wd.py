"""WD: the ILP against brute force, pruned against unpruned, against WR; segments; errors."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings, strategies as st

from ucudnn.core.errors import ConfigError, InfeasibleError, NoAlgorithmError
from ucudnn.core.measurements import UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.workspace import align_up, divide
from ucudnn.optimizers.pareto import desirable_set
from ucudnn.optimizers.solvers import available_solvers, make_solver
from ucudnn.optimizers.wd import breakdown_table, choose, optimize_wd
from ucudnn.optimizers.wr import optimize_wr
from ucudnn.plan.config import batch_sizes

import synthetic_networks as wd_networks
from test_pareto import all_configurations, kernels, policies

MiB = 2**20


@dataclass(frozen=True)
class Measured:
    """A kernel as these tests write it: a name, its table, its batch and count."""

    name: str
    table: KernelTable
    batch: int
    count: int = 1


def wd(kernels: list[Measured], *args, **kwargs):
    """optimize_wd over `kernels`, each a Kernel of its own key (synthetic_networks.synthetic_kernel) with its table."""
    network = [wd_networks.synthetic_kernel(k.name, i, k.batch, k.count) for i, k in enumerate(kernels)]
    tables = {n.problem.key: k.table for n, k in zip(network, kernels)}
    return optimize_wd(network, tables, *args, **kwargs)


@st.composite
def networks(draw):
    """1-3 kernels with counts 1-3 under one batch size policy; a total limit; an alignment."""
    policy = draw(policies)
    drawn = draw(st.lists(kernels(policy), min_size=1, max_size=3))
    counts = draw(st.lists(st.integers(1, 3), min_size=len(drawn), max_size=len(drawn)))
    wd_kernels = [Measured(f"k{i}", table, batch, count)
                  for i, ((table, batch, _), count) in enumerate(zip(drawn, counts))]
    return wd_kernels, policy, draw(st.integers(0, 3 * 2048)), draw(st.sampled_from((1, 256)))


def _options(kernels, policy, alignment, configurations):
    """(count x time, aligned workspace) of each kernel's configurations."""
    return [[(k.count * c.time_ms, align_up(c.workspace, alignment))
             for c in configurations(k.table, k.batch, batch_sizes(policy, k.batch))] for k in kernels]


def _desirable(table, batch, sizes):
    return desirable_set(table, batch, sizes, None)


def brute_force(options, capacity: int) -> float | None:
    """The least total cost of one option per group within the capacity, by enumerating every
    combination (of those with equal total weight, only the cheapest goes on)."""
    best = {0: 0.0}
    for group in options:
        extended: dict[int, float] = {}
        for w0, t0 in best.items():
            for t, w in group:
                if w0 + w <= capacity and t0 + t < extended.get(w0 + w, math.inf):
                    extended[w0 + w] = t0 + t
        best = extended
    return min(best.values(), default=None)


def _wd(kernels, policy, limit, alignment, solver="cbc"):
    return wd(kernels, functools.partial(batch_sizes, policy), limit, solver, alignment)


@settings(max_examples=60)
@given(networks())
def test_wd_optimum_equals_brute_force(network):
    kernels, policy, limit, alignment = network
    every = _options(kernels, policy, alignment, all_configurations)
    if not all(every):
        with pytest.raises(NoAlgorithmError, match=kernels[[bool(g) for g in every].index(False)].name):
            _wd(kernels, policy, limit, alignment)
        return
    expected = brute_force(every, limit)
    if expected is None:
        with pytest.raises(InfeasibleError) as error:
            _wd(kernels, policy, limit, alignment)
        assert error.value.smallest_feasible == sum(min(w for _, w in group) for group in every)
        return
    result = _wd(kernels, policy, limit, alignment)
    assert result.total_time_ms == pytest.approx(expected, rel=1e-12)
    assert result.total_workspace <= limit
    assert result.total_time_ms == pytest.approx(
        sum(k.count * result.configurations[k.name].time_ms for k in kernels))


@settings(max_examples=40)
@given(networks())
def test_pruning_loses_no_optimum(network):
    """The paper's proof (III-C1) as a test: the ILP over all configurations and over the
    desirable ones reach the same optimum."""
    kernels, policy, limit, alignment = network
    every = _options(kernels, policy, alignment, all_configurations)
    assume(all(every) and brute_force(every, limit) is not None)
    pruned = _options(kernels, policy, alignment, _desirable)
    solver = make_solver("cbc")

    def optimum(options):
        chosen = choose(options, limit, solver).chosen
        return sum(group[i][0] for group, i in zip(options, chosen))

    assert optimum(pruned) == pytest.approx(optimum(every), rel=1e-12)
    assert sum(map(len, pruned)) <= sum(map(len, every))


@settings(max_examples=40)
@given(networks(), st.integers(0, 8))
def test_wd_is_no_slower_than_wr_at_the_same_total_budget(network, units):
    """WR with L per kernel against WD with L x kernels (L a multiple of the alignment, so that
    WR's choices fit their aligned segments)."""
    kernels, policy, _, _ = network
    per_kernel = 256 * units
    try:
        wr = [optimize_wr(k.table, k.batch, batch_sizes(policy, k.batch), per_kernel) for k in kernels]
    except NoAlgorithmError:
        assume(False)
    divided = _wd(kernels, policy, per_kernel * len(kernels), 256)
    assert divided.total_time_ms <= sum(k.count * c.time_ms for k, c in zip(kernels, wr)) + 1e-9


@settings(max_examples=100)
@given(st.lists(st.integers(0, 5000), max_size=8), st.sampled_from((1, 8, 256, 1000)))
def test_segments_are_disjoint_aligned_and_inside_the_buffer(sizes, alignment):
    segments, buffer = divide({f"k{i}": s for i, s in enumerate(sizes)}, alignment)
    ordered = list(segments.values())
    assert [s.size for s in ordered] == sizes
    assert all(s.offset % alignment == 0 and 0 <= s.offset and s.end <= buffer for s in ordered)
    assert all(a.end <= b.offset for a, b in zip(ordered, ordered[1:]))
    assert buffer == sum(align_up(s, alignment) for s in sizes)


@settings(max_examples=30)
@given(networks())
def test_wd_segments_hold_the_chosen_workspaces(network):
    kernels, policy, limit, alignment = network
    try:
        result = _wd(kernels, policy, limit, alignment)
    except (InfeasibleError, NoAlgorithmError):
        assume(False)
    assert list(result.segments) == [k.name for k in kernels]
    for name, segment in result.segments.items():
        assert segment.size == result.configurations[name].workspace
        assert segment.offset % alignment == 0 and segment.end <= result.total_workspace
    assert result.total_workspace <= limit
    assert result.variables <= sum(result.desirable_sizes.values())


def _table(fast_workspace: int, scale: float = 1.0) -> KernelTable:
    """Algorithm 0: no workspace, slow; algorithm 1: faster, with workspace and a cost per call."""
    return KernelTable([Measurement(0, b, scale * b, 0) for b in (1, 2, 4)]
                       + [Measurement(1, b, scale * (b / 3 + 0.5), b * fast_workspace) for b in (1, 2, 4)])


def test_wd_gives_the_workspace_to_the_kernel_that_gains_most():
    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    result = wd(kernels, (1, 2, 4), 4 * MiB)
    assert result.configurations["big"].describe() == "1 x 4 1"
    assert result.configurations["small"].workspace == 0
    assert result.total_workspace == 4 * MiB


def test_count_weights_a_kernel_time():
    kernels = [Measured("once", _table(MiB, scale=2), 4), Measured("thrice", _table(MiB), 4, count=3)]
    result = wd(kernels, (4,), 4 * MiB)
    assert result.configurations["thrice"].workspace == 4 * MiB  # saves 3 x 2.17 > 1 x 4.33
    assert result.total_time_ms == pytest.approx(8 + 3 * (4 / 3 + 0.5))


def test_infeasible_limit_names_the_limit_and_the_smallest_total():
    table = KernelTable([Measurement(0, 4, 1.0, 1000), Measurement(1, 4, 0.5, 5000)])
    kernels = [Measured("a", table, 4), Measured("b", table, 4)]
    with pytest.raises(InfeasibleError) as error:
        wd(kernels, (4,), 2000)
    assert error.value.limit == 2000 and error.value.smallest_feasible == 2048  # 1000 -> 1024, twice
    assert "2000" in str(error.value) and "2048" in str(error.value)
    with pytest.raises(InfeasibleError, match="2048"):
        wd(kernels, (4,), 500)  # below even one kernel's smallest configuration


def test_kernel_without_algorithm_is_named():
    dead = KernelTable([Measurement(a, b, None, 0, UNSUPPORTED) for a in range(3) for b in (1, 2, 4)])
    kernels = [Measured("conv1/F", _table(MiB), 4), Measured("conv3/BF", dead, 4)]
    with pytest.raises(NoAlgorithmError, match="conv3/BF"):
        wd(kernels, (1, 2, 4), 100 * MiB)
    with pytest.raises(NoAlgorithmError, match="conv1/F"):
        wd([Measured("conv1/F", _table(MiB), 3)], (2, 4), 100 * MiB)  # no sizes sum to 3


def test_bad_kernels_are_refused():
    with pytest.raises(ConfigError, match="'a'"):
        wd([Measured("a", _table(MiB), 4), Measured("a", _table(MiB), 4)], (4,), MiB)
    with pytest.raises(ConfigError, match="count"):
        wd([Measured("a", _table(MiB), 4, count=0)], (4,), MiB)


def test_unknown_or_missing_solver_is_named_with_the_available_ones():
    with pytest.raises(ConfigError, match="'gurobi'.*unknown.*cbc"):
        wd([Measured("a", _table(MiB), 4)], (4,), MiB, solver="gurobi")
    if "glpk" not in available_solvers():
        with pytest.raises(ConfigError, match="'glpk' is not installed.*glpsol.*; installed: cbc, highs"):
            make_solver("glpk")
    assert {"cbc", "highs"} <= set(available_solvers())


@pytest.fixture
def pulp_4_without_cbc(monkeypatch):
    """PuLP 4 as `pip install pulp` leaves it (no cbc extra) on a machine with no cbc of its own:
    COIN_CMD finds no CBC binary, and PULP_CBC_CMD, with the binary PuLP 3 bundled, is gone."""
    import pulp

    monkeypatch.setattr(pulp.COIN_CMD, "available", lambda self: False)
    monkeypatch.delattr(pulp, "PULP_CBC_CMD")


def test_without_a_cbc_binary_wd_solves_with_highs(pulp_4_without_cbc):
    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    result = wd(kernels, (1, 2, 4), 4 * MiB)
    assert result.solver == "highs" and result.configurations["big"].describe() == "1 x 4 1"
    assert available_solvers()[0] == "highs"
    with pytest.raises(ConfigError, match="'cbc' is not installed.*pulp\\[cbc\\].*; installed: highs"):
        wd(kernels, (1, 2, 4), 4 * MiB, solver="cbc")


def test_with_no_solver_installed_wd_names_how_to_install_one(pulp_4_without_cbc, monkeypatch):
    import pulp

    for solver in (pulp.HiGHS, pulp.GLPK_CMD):
        monkeypatch.setattr(solver, "available", lambda self: False)
    with pytest.raises(ConfigError) as error:
        wd([Measured("a", _table(MiB), 4)], (4,), MiB)
    assert str(error.value).startswith("no ILP solver for WD is installed: ")
    assert "pip install highspy" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("kernels, limits", [(12, (12, 48, 200)), (40, (40, 160))])
def test_every_installed_solver_reaches_one_optimum(kernels, limits):
    """CBC and HiGHS (both installed: highspy is a dependency), and GLPK where glpsol is."""
    assert {"cbc", "highs"} <= set(available_solvers())
    network, tables = wd_networks.synthetic_network(kernels=kernels, seed=kernels)
    sizes = functools.partial(batch_sizes, "powerOfTwo")
    for limit in limits:
        results = [optimize_wd(network, tables, sizes, limit * MiB, s) for s in available_solvers()]
        assert [r.solver for r in results] == available_solvers()
        assert all(r.total_time_ms == pytest.approx(results[0].total_time_ms, rel=1e-9) for r in results)
        assert all(r.total_workspace <= limit * MiB for r in results)


def test_the_ilp_is_read_as_pulp_4_returns_it(monkeypatch):
    """PuLP 4's solve() returns an LpSolveStats (status, status_str) where PuLP 3's returned the
    status code, its LpStatus table is gone, and an expression is built by from_list."""
    import pulp

    solve, built = pulp.LpProblem.solve, []

    class Stats:
        def __init__(self, status: int):
            self.status, self.status_str = status, {1: "Optimal"}.get(status, "Infeasible")

    def from_list(cls, pairs):
        built.append(len(pairs))
        return cls(pairs)

    monkeypatch.setattr(pulp.LpProblem, "solve", lambda self, *args: Stats(solve(self, *args)))
    monkeypatch.setattr(pulp.LpAffineExpression, "from_list", classmethod(from_list), raising=False)
    monkeypatch.delattr(pulp, "LpStatus")
    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    result = wd(kernels, (1, 2, 4), 4 * MiB)
    assert result.configurations["big"].describe() == "1 x 4 1" and built


def test_sizes_may_be_fixed_or_depend_on_the_batch():
    kernels = [Measured("a", _table(MiB), 4), Measured("b", _table(MiB, 2), 4)]
    fixed = wd(kernels, iter((1, 2, 4)), 3 * MiB)  # a one-shot iterator serves every kernel
    by_batch = wd(kernels, functools.partial(batch_sizes, "powerOfTwo"), 3 * MiB)
    assert fixed.configurations == by_batch.configurations


def test_breakdown_table_lists_every_kernel_and_the_total():
    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    result = wd(kernels, (1, 2, 4), 4 * MiB)
    lines = breakdown_table(result, ["big", "small"], algo_name=lambda kernel, algo: "AB"[algo]).splitlines()
    assert lines[0].split() == ["kernel", "configuration", "time", "ms", "workspace", "MiB", "share", "%"]
    assert lines[1].split()[:5] == ["big", "1", "x", "4", "B"] and lines[1].split()[-2:] == ["4.00", "100.0"]
    assert lines[2].startswith("small") and lines[2].split()[-1] == "0.0"
    assert lines[3].startswith("total") and "4.00" in lines[3]


def test_plot_division_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from ucudnn.reports.plots import plot_division

    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    path = tmp_path / "division.png"
    plot_division(wd(kernels, (1, 2, 4), 6 * MiB), path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resnet50_sized_solve():
    """160 kernels, B = 32, powerOfTwo, 8 algorithms (one unsupported, two for 3x3 only), 16 MiB a
    kernel (ResNet-50's 2,544 MiB in the paper); `pytest -s` prints its size and seconds."""
    kernels, tables = wd_networks.synthetic_network(kernels=160, batch=32, seed=0)
    result = optimize_wd(kernels, tables, functools.partial(batch_sizes, "powerOfTwo"), 160 * 16 * MiB)
    print(f"ResNet-50-sized WD: {result.variables} variables, build {result.build_seconds:.3f} s, "
          f"solve {result.solve_seconds:.3f} s ({result.solver})")
    assert result.total_workspace <= 160 * 16 * MiB and result.variables >= len(kernels)


def test_recorded_resnet50_solve():
    """On the shipped H100 measurements: ResNet-50, B = 32, all three kernels of every conv layer
    (identical layers as one kernel with a count), powerOfTwo, 16 MiB a kernel."""
    from ucudnn.measure.cache import recorded_path

    if recorded_path() is None:
        pytest.skip("no recorded measurements are shipped in cache/")
    kernels, tables = wd_networks.recorded_network(str(recorded_path()), "resnet50", 32, "H100")
    result = optimize_wd(kernels, tables, functools.partial(batch_sizes, "powerOfTwo"), len(kernels) * 16 * MiB)
    print(f"recorded ResNet-50 WD: {len(kernels)} kernels, {result.variables} variables, "
          f"build {result.build_seconds:.3f} s, solve {result.solve_seconds:.3f} s ({result.solver})")
    assert len(kernels) == 69 and result.variables >= len(kernels)
    assert result.total_workspace <= len(kernels) * 16 * MiB


@pytest.mark.parametrize("solver", available_solvers())
def test_the_ilp_path_warns_of_nothing_pulp_4_removes(monkeypatch, solver):
    """PuLP 3.3 warns (DeprecationWarning) of each call 4.0 removes (PULP_CBC_CMD, LpVariable(...),
    ...): the ILP path, solver included, runs with every warning an error, as PuLP's migration
    guide checks, and makes no such call even where a filter of its own would silence it (WD
    silenced PULP_CBC_CMD's)."""
    import warnings

    deprecated, warn = [], warnings.warn

    def recorded(message, category=None, *args, **kwargs):
        if isinstance(category, type) and issubclass(category, DeprecationWarning):
            deprecated.append(str(message))
        return warn(message, category, *args, **kwargs)

    monkeypatch.setattr(warnings, "warn", recorded)
    kernels = [Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = wd(kernels, (1, 2, 4), 6 * MiB, solver=solver)
    assert result.total_workspace <= 6 * MiB and deprecated == []


def test_cbc_runs_through_coin_cmd_which_pulp_4_keeps():
    """PULP_CBC_CMD (PuLP's bundled CBC, deprecated in 3.3, gone in 4.0) was ucudnn's fallback
    where no cbc is on the PATH, its warning silenced; CBC now always runs through COIN_CMD."""
    import pulp

    solver = make_solver("cbc")
    assert type(solver) is pulp.COIN_CMD and solver.available()
