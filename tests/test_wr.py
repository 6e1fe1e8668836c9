"""WR dynamic program against brute force over every split, on random time tables."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from ucudnn.core.errors import NoAlgorithmError
from ucudnn.core.measurements import FAILED, OK, OUT_OF_MEMORY, OVER_CAP, UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.staging import Slices
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.optimizers.wr import optimize_wr
from ucudnn.plan.config import POLICIES, batch_sizes

WORKSPACES = (0, 1, 100, 1000, 4096, 10**6)
LIMITS = (None, 0, 1, 99, 100, 1000, 5000, 10**6)


def multisets(total: int, sizes: tuple[int, ...], smallest: int = 0):
    """Every multiset of parts from `sizes` summing to `total`, as non-decreasing tuples."""
    if total == 0:
        yield ()
        return
    for i in range(smallest, len(sizes)):
        b = sizes[i]
        if b > total:
            break
        for rest in multisets(total - b, sizes, i):
            yield (b, *rest)


def fastest_within(table: KernelTable, b: int, limit: int | None) -> float | None:
    """T1(b): the fastest available algorithm at b within the limit, by scanning the table."""
    times = [m.time_ms for m in table if m.batch == b and m.status == OK
             and (limit is None or m.workspace <= limit)]
    return min(times, default=None)


def brute_force(table: KernelTable, batch: int, sizes: tuple[int, ...], limit: int | None) -> float | None:
    best = None
    usable = tuple(sorted(b for b in set(sizes) if b <= batch))
    for parts in multisets(batch, usable):
        times = [fastest_within(table, b, limit) for b in parts]
        if None not in times:
            total = math.fsum(times)
            best = total if best is None else min(best, total)
    return best


@st.composite
def tables(draw, max_batch: int = 14):
    batch = draw(st.integers(1, max_batch))
    policy = draw(st.sampled_from(POLICIES))
    sizes = batch_sizes(policy, batch)
    n_algos = draw(st.integers(1, 4))
    integer_times = draw(st.booleans())  # integer times make many ties
    time = st.integers(1, 20).map(float) if integer_times else st.floats(0.001, 100.0, allow_nan=False)
    measurements = []
    for b in sizes:
        for a in range(n_algos):
            status = draw(st.sampled_from([OK, OK, OK, OK, UNSUPPORTED, FAILED, OUT_OF_MEMORY, OVER_CAP]))
            t = draw(time) if status == OK else None
            measurements.append(Measurement(a, b, t, draw(st.sampled_from(WORKSPACES)), status, repeats=3))
    limit = draw(st.sampled_from(LIMITS))
    return KernelTable(measurements), batch, sizes, limit


def check_configuration(config: Configuration, table: KernelTable, batch: int, sizes, limit) -> None:
    assert isinstance(config, Configuration)
    assert config.batch == batch == sum(m.batch for m in config.micro)
    assert config.micro, "a configuration has at least one part"
    assert [m.batch for m in config.micro] == sorted((m.batch for m in config.micro), reverse=True)
    for part in config.micro:
        assert part.batch in sizes
        assert limit is None or part.workspace <= limit
        measured = [m for m in table.at(part.batch) if m.algo == part.algo]
        assert len(measured) == 1
        m = measured[0]
        assert m.status == OK, "only available algorithms may be chosen"
        assert (part.time_ms, part.workspace) == (m.time_ms, m.workspace)
        # Each part runs the fastest algorithm that fits at its size.
        assert part.time_ms == fastest_within(table, part.batch, limit)
    assert config.time_ms == pytest.approx(math.fsum(m.time_ms for m in config.micro), rel=1e-12)
    assert config.workspace == max(m.workspace for m in config.micro)


@settings(max_examples=300)
@given(tables())
@example((KernelTable([Measurement(0, 1, 1.0, 0), Measurement(0, 2, 3.0, 0)]), 2, (1, 2), None))
@example((KernelTable([Measurement(0, 2, 1.0, 0), Measurement(0, 3, 1.0, 0), Measurement(0, 5, 5.0, 0)]),
          5, (2, 3, 5), None))
def test_dp_matches_brute_force(case):
    table, batch, sizes, limit = case
    best = brute_force(table, batch, sizes, limit)
    if best is None:
        with pytest.raises(NoAlgorithmError):
            optimize_wr(table, batch, sizes, limit, kernel="conv1 F")
        return
    config = optimize_wr(table, batch, sizes, limit, kernel="conv1 F")
    check_configuration(config, table, batch, sizes, limit)
    assert config.time_ms == pytest.approx(best, rel=1e-9)


@settings(max_examples=200)
@given(tables())
def test_undivided_is_cudnns_choice(case):
    table, batch, _, limit = case
    candidates = [m for m in table.at(batch) if m.status == OK and (limit is None or m.workspace <= limit)]
    if not candidates:
        with pytest.raises(NoAlgorithmError):
            optimize_wr(table, batch, batch_sizes("undivided", batch), limit)
        return
    config = optimize_wr(table, batch, batch_sizes("undivided", batch), limit)
    assert len(config.micro) == 1
    (part,) = config.micro
    assert part.batch == batch
    assert part.time_ms == min(m.time_ms for m in candidates)
    assert part == MicroConfig(*(lambda m: (m.algo, m.batch, m.time_ms, m.workspace))(table.fastest(batch, limit)))


@settings(max_examples=100)
@given(tables(), st.sampled_from(LIMITS))
def test_larger_limit_is_never_slower(case, other):
    table, batch, sizes, limit = case
    lo, hi = sorted((limit, other), key=lambda v: math.inf if v is None else v)

    def best(lim):
        try:
            return optimize_wr(table, batch, sizes, lim).time_ms
        except NoAlgorithmError:
            return math.inf

    assert best(hi) <= best(lo) * (1 + 1e-12)


@settings(max_examples=100)
@given(tables())
def test_more_sizes_are_never_slower(case):
    """S(undivided) is a subset of S(powerOfTwo), itself a subset of S(all)."""
    table, batch, _, limit = case
    sizes = batch_sizes("all", batch)
    table = KernelTable(list(table) + [Measurement(9, b, float(b), 0) for b in sizes])  # all feasible
    times = [optimize_wr(table, batch, batch_sizes(p, batch), limit).time_ms
             for p in ("undivided", "powerOfTwo", "all")]
    assert times[0] >= times[1] * (1 - 1e-12) and times[1] >= times[2] * (1 - 1e-12)


def test_split_beats_undivided_under_tight_limit():
    # Algorithm 0: fast, workspace grows with the batch. Algorithm 1: three times slower, no workspace.
    table = KernelTable([Measurement(0, b, 1.0 * b, 100 * b) for b in (1, 2, 4)]
                        + [Measurement(1, b, 3.0 * b, 0) for b in (1, 2, 4)])
    undivided = optimize_wr(table, 4, (4,), 200)
    assert undivided.micro == (MicroConfig(1, 4, 12.0, 0),)
    config = optimize_wr(table, 4, (1, 2, 4), 200)
    assert config.micro == (MicroConfig(0, 2, 2.0, 200), MicroConfig(0, 2, 2.0, 200))
    assert config.time_ms == 4.0 and config.workspace == 200
    assert optimize_wr(table, 4, (1, 2, 4), None).micro == (MicroConfig(0, 4, 4.0, 400),)
    assert optimize_wr(table, 4, (1, 2, 4), 100).micro == (MicroConfig(0, 1, 1.0, 100),) * 4


def test_non_power_of_two_batch_uses_the_remainder():
    # B=6 with powerOfTwo sizes {1, 2, 4, 6}: 4 + 2 is the fastest split that fits.
    table = KernelTable([Measurement(0, 6, 1.0, 10**6), Measurement(1, 6, 30.0, 0),
                         Measurement(0, 4, 2.0, 1000), Measurement(0, 2, 1.5, 500), Measurement(0, 1, 1.0, 10)])
    config = optimize_wr(table, 6, batch_sizes("powerOfTwo", 6), 1000)
    assert [(m.algo, m.batch) for m in config.micro] == [(0, 4), (0, 2)]
    assert config.time_ms == 3.5


def test_ties_keep_fewer_calls():
    table = KernelTable([Measurement(0, b, float(b), 0) for b in range(1, 9)])
    config = optimize_wr(table, 8, range(1, 9), None)
    assert [m.batch for m in config.micro] == [8]


def test_sizes_above_batch_are_ignored():
    table = KernelTable([Measurement(0, 16, 0.1, 0), Measurement(0, 4, 1.0, 0)])
    config = optimize_wr(table, 8, (4, 16), None)
    assert [m.batch for m in config.micro] == [4, 4]


def test_unmeasured_sizes_are_skipped():
    table = KernelTable([Measurement(0, 2, 1.0, 0)])
    assert [m.batch for m in optimize_wr(table, 6, (1, 2, 3, 6), None).micro] == [2, 2, 2]


def test_unavailable_algorithms_are_never_chosen():
    table = KernelTable([Measurement(0, 4, 0.1, 0, UNSUPPORTED), Measurement(1, 4, 0.2, 0, FAILED),
                         Measurement(2, 4, None, 0, OVER_CAP), Measurement(3, 4, 0.3, 0, OUT_OF_MEMORY),
                         Measurement(4, 4, 9.0, 0)])
    assert optimize_wr(table, 4, (4,), None).micro == (MicroConfig(4, 4, 9.0, 0),)


@pytest.mark.parametrize("table, sizes", [
    # Every algorithm needs more than the limit.
    (KernelTable([Measurement(0, 8, 1.0, 4096), Measurement(1, 8, 2.0, 2048)]), (8,)),
    # Only unavailable algorithms fit.
    (KernelTable([Measurement(0, 8, 1.0, 0, UNSUPPORTED), Measurement(1, 8, None, 0, FAILED)]), (8,)),
    # Nothing measured at all.
    (KernelTable(), (1, 2, 4, 8)),
    # Parts fit, but no multiset of the sizes that fit sums to the batch.
    (KernelTable([Measurement(0, 3, 1.0, 0), Measurement(0, 8, 1.0, 10**9)]), (3, 8)),
])
def test_no_algorithm_error_names_kernel_and_limit(table, sizes):
    with pytest.raises(NoAlgorithmError) as info:
        optimize_wr(table, 8, sizes, 1024, kernel="conv2_1 BF")
    message = str(info.value)
    assert "conv2_1 BF" in message
    assert "1024" in message


def test_unlimited_uses_any_workspace():
    table = KernelTable([Measurement(0, 2, 1.0, 10**12), Measurement(1, 2, 5.0, 0)])
    assert optimize_wr(table, 2, (2,), None).micro[0].algo == 0
    assert optimize_wr(table, 2, (2,), 10**12).micro[0].algo == 0
    assert optimize_wr(table, 2, (2,), 10**12 - 1).micro[0].algo == 1


def test_multisets_helper_enumerates_partitions():
    """The brute force is only as good as its enumeration: p(n) partitions with every size allowed."""
    partition_counts = [1, 1, 2, 3, 5, 7, 11, 15, 22, 30, 42, 56, 77, 101, 135]
    for n, count in enumerate(partition_counts):
        parts = list(multisets(n, tuple(range(1, n + 1))))
        assert len(parts) == len(set(parts)) == count
        assert all(sum(p) == n for p in parts)
    assert sorted(multisets(6, (1, 2, 4, 6))) == sorted(
        [(1,) * 6, (1, 1, 1, 1, 2), (1, 1, 2, 2), (2, 2, 2), (1, 1, 4), (2, 4), (6,)])


def compositions(total: int, sizes: tuple[int, ...]):
    """Every ordered sequence of parts from `sizes` summing to `total`."""
    if total == 0:
        yield ()
        return
    for b in sizes:
        if b <= total:
            for rest in compositions(total - b, sizes):
                yield (b, *rest)


def staged_brute_force(table: KernelTable, batch: int, sizes: tuple[int, ...], limit: int | None,
                       slices: Slices) -> float | None:
    """Brute force over every ordered split: a part starting at s costs the fastest algorithm
    that fits with its staging, plus the staging's copies."""
    best = None
    usable = tuple(sorted(b for b in set(sizes) if b <= batch))
    for parts in compositions(batch, usable):
        times, start = [], 0
        for b in parts:
            ms, extra = slices.extra(slices.staged(start), b)
            fits = None if limit is None else limit - extra
            t = fastest_within(table, b, fits) if fits is None or fits >= 0 else None
            times.append(None if t is None else t + ms)
            start += b
        if None not in times:
            best = math.fsum(times) if best is None else min(best, math.fsum(times))
    return best


sample_bytes = st.sampled_from((0, 2, 4, 64, 96, 100, 128, 256, 1000))


@settings(max_examples=300, deadline=None)
@given(tables(max_batch=10), sample_bytes, sample_bytes)
def test_dp_with_staged_parts_matches_brute_force(case, x, y):
    """Where a part's cost depends on where it starts (staging), the DP over starts is exact."""
    table, batch, sizes, limit = case
    slices = Slices(x, y)
    best = staged_brute_force(table, batch, sizes, limit, slices)
    if best is None:
        with pytest.raises(NoAlgorithmError):
            optimize_wr(table, batch, sizes, limit, slices=slices)
        return
    config = optimize_wr(table, batch, sizes, limit, slices=slices)
    assert config.batch == batch and config.time_ms == pytest.approx(best, rel=1e-9)
    start = 0
    for part in config.micro:
        ms, extra = slices.extra(slices.staged(start), part.batch)
        m = next(m for m in table.at(part.batch) if m.algo == part.algo)
        assert (part.time_ms, part.workspace) == (pytest.approx(m.time_ms + ms), m.workspace + extra)
        assert limit is None or part.workspace <= limit
        start += part.batch


def test_a_sample_off_the_alignment_splits_through_staging_where_the_fast_plan_fits():
    """Caffe AlexNet conv1/BD in fp16 (its numbers, docs/results.md): a 3x227x227 fp16 sample is
    309,174 bytes, so only parts at multiples of 128 samples start aligned, and the fast plan
    needs 109 MiB at 128 samples. Within 64 MiB the plan splits, staging the parts that start off
    the alignment, instead of falling back to the slow plan."""
    mib = 2**20
    fast = {128: (0.31, 109 * mib), 64: (0.153, 54.6 * mib), 32: (0.08, 27.3 * mib), 16: (0.041, 13.7 * mib)}
    table = KernelTable([Measurement("engines:fast", b, t, int(ws)) for b, (t, ws) in fast.items()]
                        + [Measurement("engines:slow", b, 426.45 * b / 256, 0) for b in (16, 32, 64, 128, 256)])
    slices = Slices(x=3 * 227 * 227 * 2, y=96 * 55 * 55 * 2)
    config = optimize_wr(table, 256, (16, 32, 64, 128, 256), 64 * mib, slices=slices)
    assert {m.algo for m in config.micro} == {"engines:fast"}
    assert config.time_ms < 1.0 and config.workspace <= 64 * mib
    starts = np.cumsum([0] + [m.batch for m in config.micro])[:-1]
    for start, part in zip(starts, config.micro):
        staged = slices.staged(int(start))
        assert (start % 128 == 0) == (staged == ())
        assert part.workspace == int(fast[part.batch][1]) + slices.extra(staged, part.batch)[1]
    with pytest.raises(NoAlgorithmError):  # the slices alone would not fit: staging is never free
        optimize_wr(KernelTable([Measurement("engines:fast", 16, 0.04, 0)]), 32, (16,), 1000, slices=slices)
