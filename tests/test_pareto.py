"""Desirable sets: the set-valued DP against brute force, and against WR."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ucudnn.core.errors import NoAlgorithmError
from ucudnn.core.measurements import OK, OVER_CAP, PRUNED, UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.staging import Slices
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.optimizers.pareto import desirable_set, desirable_sets, pareto_order, plannable
from ucudnn.optimizers.wr import optimize_wr
from ucudnn.plan.config import batch_sizes

import synthetic_networks

WORKSPACES = (0, 100, 256, 300, 512, 1000, 2048)


policies = st.sampled_from(("all", "powerOfTwo"))


@st.composite
def kernels(draw, policy: str | None = None, max_batch: int = 6):
    """(table, batch, sizes): 2-3 algorithms, some unavailable; times in quarters so that sums
    are exact and ties happen."""
    batch = draw(st.integers(1, max_batch))
    sizes = batch_sizes(policy or draw(policies), batch)
    table = KernelTable()
    for algo in range(draw(st.integers(2, 3))):
        for b in sizes:
            status = draw(st.sampled_from((OK, OK, OK, UNSUPPORTED)))
            time_ms = draw(st.integers(1, 40)) / 4 if status == OK else None
            table.add(Measurement(algo, b, time_ms, draw(st.sampled_from(WORKSPACES)), status))
    return table, batch, sizes


limits = st.one_of(st.none(), st.sampled_from(WORKSPACES), st.integers(0, 2048))


def all_configurations(table: KernelTable, batch: int, sizes, limit: int | None = None) -> list[Configuration]:
    """Every multiset of available micro-configurations that sums to `batch`."""
    micros = [MicroConfig(m.algo, b, m.time_ms, m.workspace)
              for b in sorted(set(sizes)) if b <= batch for m in table.choices(b, limit)]

    def extend(rest: int, first: int):
        if rest == 0:
            yield ()
        for i in range(first, len(micros)):
            if micros[i].batch <= rest:
                for tail in extend(rest - micros[i].batch, i):
                    yield (micros[i], *tail)

    return [Configuration(parts) for parts in extend(batch, 0)]


def front_points(configurations: list[Configuration]) -> list[tuple[int, float]]:
    points = {(c.workspace, c.time_ms) for c in configurations}
    return sorted((w, t) for w, t in points
                  if not any(w2 <= w and t2 <= t and (w2, t2) != (w, t) for w2, t2 in points))


@settings(max_examples=150)
@given(kernels(), limits)
def test_desirable_set_is_the_pareto_front_of_all_configurations(kernel, limit):
    table, batch, sizes = kernel
    front = desirable_set(table, batch, sizes, limit)
    assert [(c.workspace, c.time_ms) for c in front] == front_points(all_configurations(table, batch, sizes, limit))


@settings(max_examples=100)
@given(kernels(), limits)
def test_desirable_configurations_are_real_and_ordered(kernel, limit):
    table, batch, sizes = kernel
    front = desirable_set(table, batch, sizes, limit)
    for c in front:
        assert c.batch == batch
        assert limit is None or c.workspace <= limit
        for m in c.micro:
            measured = next(x for x in table.choices(m.batch) if x.algo == m.algo)
            assert (m.time_ms, m.workspace) == (measured.time_ms, measured.workspace)
            assert m.batch in sizes
    assert all(a.workspace < b.workspace and a.time_ms > b.time_ms for a, b in zip(front, front[1:]))


@settings(max_examples=100)
@given(kernels(), st.one_of(st.none(), st.sampled_from(WORKSPACES)))
def test_wr_answer_is_the_fastest_desirable_point_within_its_limit(kernel, limit):
    table, batch, sizes = kernel
    front = desirable_set(table, batch, sizes, limit)
    for wr_limit in [limit, *(w for w in WORKSPACES if limit is None or w <= limit)]:
        fitting = [c for c in front if wr_limit is None or c.workspace <= wr_limit]
        try:
            wr = optimize_wr(table, batch, sizes, wr_limit)
        except NoAlgorithmError:
            assert not fitting
            continue
        assert wr.time_ms == fitting[-1].time_ms


@settings(max_examples=50)
@given(st.lists(kernels(), min_size=1, max_size=4), limits)
def test_kernels_together_equal_kernels_alone(many, limit):
    together = desirable_sets(many, limit)
    assert together == [desirable_set(table, batch, sizes, limit) for table, batch, sizes in many]


def test_pareto_order_keeps_one_of_exact_ties_and_drops_dominated_points():
    time = np.array([5.0, 3.0, 3.0, 4.0, 1.0, 1.0])
    workspace = np.array([0, 10, 10, 20, 30, 40])
    # (4.0, 20) is beaten by (3.0, 10); (1.0, 40) by (1.0, 30); the two (3.0, 10) are one
    assert pareto_order(time, workspace).tolist() == [0, 1, 4]
    assert pareto_order(np.zeros(0), np.zeros(0, dtype=np.int64)).tolist() == []


def test_no_available_algorithm_gives_an_empty_set():
    table = KernelTable([Measurement(0, 4, None, 0, UNSUPPORTED), Measurement(1, 4, 1.0, 10**9, OVER_CAP),
                         Measurement(2, 2, 1.0, 0)])
    assert desirable_set(table, 4, (4,), None) == []
    assert desirable_set(table, 4, (2, 4), 0) == [Configuration((MicroConfig(2, 2, 1.0, 0),) * 2)]
    assert desirable_set(table, 3, (2,), None) == []  # 2 + 2 overshoots 3


def test_undivided_front_is_the_algorithms_front():
    table = KernelTable([Measurement(0, 8, 9.0, 0), Measurement(1, 8, 4.0, 500), Measurement(2, 8, 5.0, 800),
                         Measurement(3, 8, 2.0, 900)])
    front = desirable_set(table, 8, (8,), None)
    assert [c.micro[0].algo for c in front] == [0, 1, 3]


def test_alexnet_sized_kernel_with_every_micro_batch_size():
    """B = 256, the `all` policy, 7 algorithms (one unsupported of 8); `pytest -s` prints its seconds."""
    rng = np.random.default_rng(0)
    sizes = batch_sizes("all", 256)
    table = synthetic_networks.synthetic_table(sizes, 0.2, 2**20, True, rng)
    start = time.perf_counter()
    front = desirable_set(table, 256, sizes, None)
    seconds = time.perf_counter() - start
    print(f"AlexNet-sized desirable set: {len(front)} configurations in {seconds:.3f} s")
    assert 10 < len(front) < 200
    for limit in (0, 2**20, 2**24, 2**28):
        best = optimize_wr(table, 256, sizes, limit)
        assert best.time_ms == pytest.approx(max((c for c in front if c.workspace <= limit),
                                                 key=lambda c: c.workspace).time_ms)


def staged_configurations(table: KernelTable, batch: int, sizes, limit: int | None, slices: Slices) -> list[Configuration]:
    """Every ordered sequence of available micro-configurations that sums to `batch`, each part's
    staging (where it starts) in its time and workspace, within `limit`."""
    usable = sorted(b for b in set(sizes) if b <= batch)

    def extend(start: int):
        if start == batch:
            yield ()
        for b in usable:
            ms, extra = slices.extra(slices.staged(start), b)
            for m in table.choices(b, None if limit is None else limit - extra) if start + b <= batch else ():
                for tail in extend(start + b):
                    yield (MicroConfig(m.algo, b, m.time_ms + ms, m.workspace + extra), *tail)

    return [Configuration(parts) for parts in extend(0)]


@settings(max_examples=150, deadline=None)
@given(kernels(), limits, st.sampled_from((2, 64, 96, 100)), st.sampled_from((0, 4, 128)))
def test_desirable_set_with_staging_is_the_front_of_every_ordered_configuration(kernel, limit, x, y):
    """Where a part's cost depends on where it starts, the front is over ordered configurations,
    and each desirable configuration's parts carry the staging of where they start."""
    table, batch, sizes = kernel
    slices = Slices(x, y)
    front = desirable_set(table, batch, sizes, limit, slices)
    every = staged_configurations(table, batch, sizes, limit, slices)
    assert [(c.workspace, pytest.approx(c.time_ms)) for c in front] == front_points(every)
    for c in front:
        start = 0
        for part in c.micro:
            ms, extra = slices.extra(slices.staged(start), part.batch)
            m = next(m for m in table.at(part.batch) if m.algo == part.algo)
            assert part.workspace == m.workspace + extra and part.time_ms == pytest.approx(m.time_ms + ms)
            start += part.batch


def test_plannable_keeps_the_front_the_over_cap_rows_and_one_row_where_none_is_available():
    m = lambda algo, t, ws, status=OK: Measurement(algo, 8, t, ws, status)  # noqa: E731
    rows = [m("a", 1.0, 100), m("b", 2.0, 0), m("c", 1.5, 200), m("d", 3.0, 50), m("e", 1.0, 100),
            m("f", None, 0, UNSUPPORTED), m("g", None, 10**12, OVER_CAP), m("h", None, 0, PRUNED)]
    kept = plannable(rows)
    # c and d are dominated (a, b beat them), e ties a exactly (the first name stays), f is unusable;
    # g and h were not timed: a later run (h: a full search) measures them
    assert sorted(x.algo for x in kept) == ["a", "b", "g", "h"]
    assert plannable([m("z", None, 0, UNSUPPORTED), m("y", None, 0, UNSUPPORTED)]) == [m("y", None, 0, UNSUPPORTED)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.floats(0.01, 10.0), st.integers(0, 8) .map(lambda k: k * 2**20),
                          st.sampled_from([OK, OK, OK, UNSUPPORTED, OVER_CAP])), min_size=1, max_size=40),
       st.sampled_from([None, 0, 2**20, 3 * 2**20, 8 * 2**20]))
def test_wr_plans_the_same_from_the_plannable_rows(rows, limit):
    """What a pruned file keeps plans exactly as the whole file does, at any limit."""
    table = KernelTable(Measurement(f"legacy:A{i}", b, t if s == OK else None, ws, s) for i, (b, t, ws, s) in enumerate(rows))
    by_size: dict[int, list[Measurement]] = {}
    for measurement in table:
        by_size.setdefault(measurement.batch, []).append(measurement)
    pruned = KernelTable(kept for found in by_size.values() for kept in plannable(found))
    for batch in (8, 16):
        sizes = [s for s in (1, 2, 4, 8, 16) if s <= batch]
        assert pruned.complete_for(batch, limit) == table.complete_for(batch, limit)
        try:
            want = optimize_wr(table, batch, sizes, limit)
        except NoAlgorithmError:
            with pytest.raises(NoAlgorithmError):
                optimize_wr(pruned, batch, sizes, limit)
            continue
        got = optimize_wr(pruned, batch, sizes, limit)
        assert (got.time_ms, got.workspace) == (want.time_ms, want.workspace)
