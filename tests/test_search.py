"""The pruned and the full search: what each needs measured, what a pruned measurement records,
and that a PRUNED row never takes the place of a measurement (ucudnn.optimizers.search)."""
from __future__ import annotations

import dataclasses
import types

import pytest

from ucudnn.core.measurements import OK, OUT_OF_MEMORY, OVER_CAP, PRUNED, KernelTable, Measurement, ShapeTable
from ucudnn.core.problem import ConvProblem
from ucudnn.execute import gpu
from ucudnn.execute.backends import Backends, Candidate
from ucudnn.execute.dispatch import Plan
from ucudnn.measure import benchmark
from ucudnn.measure.benchmark import ensure_tables
from ucudnn.measure.cache import Cache
from ucudnn.measure.cache.database import BenchmarkDatabase
from ucudnn.optimizers.search import FULL, PRUNED_SEARCH, named
from ucudnn.plan.config import Settings

from fakes import FAKE_DEVICE, FakeBenchmarker

MiB = 2**20
P = ConvProblem("F", (32, 4, 6, 6), (4, 4, 3, 3), pads=1)
SIZES = (1, 2, 4, 8, 16, 32)


def table(rows):
    """rows: (batch, algo, ms or None, workspace, status)."""
    return KernelTable(Measurement(f"legacy:{a}", b, ms, ws, status) for b, a, ms, ws, status in rows)


def test_full_search_needs_every_size_and_measures_pruned_rows_again():
    t = table([(b, "A", 1.0 * b, 0, OK) for b in SIZES] + [(8, "B", None, 0, PRUNED)])
    assert FULL.sizes(t, SIZES, 8 * MiB) == list(SIZES)
    assert FULL.missing(t, SIZES, 8 * MiB) == [8]
    assert PRUNED_SEARCH.missing(t, SIZES, 8 * MiB) == []  # a pruned search made that row


def test_where_the_cap_keeps_nothing_out_the_whole_batch_alone_is_needed():
    t = table([(32, "A", 3.0, 0, OK), (32, "B", None, 0, PRUNED)])
    assert PRUNED_SEARCH.sizes(t, SIZES, 8 * MiB) == [32] and PRUNED_SEARCH.missing(t, SIZES, 8 * MiB) == []
    assert PRUNED_SEARCH.sizes(table([]), SIZES, None) == [32]  # unlimited: nothing can be kept out


def test_the_walk_goes_down_while_smaller_sizes_pay_or_a_kept_out_candidate_shrinks():
    # B needs 1 MiB a sample: over 8 MiB down to 8 samples, where it fits and runs 4x faster a sample
    rows = [(b, "A", 1.0 * b, 0, OK) for b in SIZES]
    rows += [(b, "B", None, MiB * b, OVER_CAP) for b in (32, 16)] + [(b, "B", 0.25 * b, MiB * b, OK) for b in (8, 4)]
    t = table(rows)
    # 16: no faster a sample than 32, but B shrank (32 -> 16 MiB): go on; 8: B fits, and the cap
    # keeps nothing out there: no smaller size can do better
    assert PRUNED_SEARCH.sizes(t, SIZES, 8 * MiB) == [32, 16, 8]
    unmeasured = table([r for r in rows if r[0] != 8])
    assert PRUNED_SEARCH.missing(unmeasured, SIZES, 8 * MiB) == [8]  # not measured yet: that one first
    # a kept-out candidate whose workspace does not shrink with the batch: no size below pays
    constant = table([(b, "A", 1.0 * b, 0, OK) for b in SIZES] + [(b, "B", None, 64 * MiB, OVER_CAP) for b in SIZES])
    assert PRUNED_SEARCH.sizes(constant, SIZES, 8 * MiB) == [32, 16]


def test_below_a_size_candidates_far_slower_there_than_one_with_no_more_workspace_are_skipped():
    t = table([(32, "A", 1.0, 0, OK), (32, "B", 5.0, 0, OK), (32, "C", 0.5, MiB, OK), (32, "D", 3.0, 2 * MiB, OK),
               (32, "E", None, 64 * MiB, OVER_CAP)])
    # B: 5x A (same workspace); D: 6x C (less workspace); E was not timed: measured again
    assert PRUNED_SEARCH.skipped(t, 16) == {"legacy:B", "legacy:D"}
    assert PRUNED_SEARCH.skipped(t, 32) == frozenset() and FULL.skipped(t, 16) == frozenset()


def test_the_search_setting_names_one():
    assert named("full") is FULL and named("pruned") is PRUNED_SEARCH
    assert Settings().search == "pruned" and Settings.load(search="FULL").search == "full"
    from ucudnn.core.errors import ConfigError
    with pytest.raises(ConfigError, match="search"):
        named("quick")


def test_a_pruned_row_never_replaces_a_measurement_in_memory_or_in_the_file(tmp_path):
    taken, pruned = Measurement("legacy:A", 8, 1.0, 0, OK, 3), Measurement("legacy:A", 8, None, 0, PRUNED)
    assert list(ShapeTable([taken, pruned])) == [taken]
    assert list(ShapeTable([pruned, taken])) == [taken]
    path = tmp_path / "db.sqlite"
    with BenchmarkDatabase(path) as db:
        db.record(P, FAKE_DEVICE, [taken])
        db.record(P, FAKE_DEVICE, [pruned])
        assert [m.status for m in db.table(P, FAKE_DEVICE)] == [OK]
        db.record(P.with_batch(16), FAKE_DEVICE, [Measurement("legacy:A", 16, None, 0, PRUNED)])
        db.record(P.with_batch(16), FAKE_DEVICE, [Measurement("legacy:A", 16, 2.0, 0, OK, 3)])
        assert sorted(m.status for m in db.table(P, FAKE_DEVICE)) == [OK, OK]


@pytest.mark.parametrize("status", [OVER_CAP, OUT_OF_MEMORY])
def test_a_row_of_circumstance_and_a_pruned_one_replace_each_other_but_never_a_taken_one(tmp_path, status):
    """Over the cap (or out of memory) at one cap and pruned at a larger one reads as pruned,
    else the row would stay unmeasured and every later process would measure it again."""
    unmeasured = Measurement("legacy:A", 8, None, 4 * MiB, status)
    pruned, taken = Measurement("legacy:A", 8, None, 0, PRUNED), Measurement("legacy:A", 8, 1.0, 4 * MiB, OK, 3)
    assert list(ShapeTable([unmeasured, pruned])) == [pruned] and list(ShapeTable([pruned, unmeasured])) == [unmeasured]
    assert list(ShapeTable([taken, unmeasured])) == [taken]
    with BenchmarkDatabase(tmp_path / "db.sqlite") as db:
        for rows, kept in (([unmeasured, pruned], PRUNED), ([taken, unmeasured], OK)):
            for m in rows:
                db.record(P, FAKE_DEVICE, [m])
            assert [m.status for m in db.table(P, FAKE_DEVICE)] == [kept]


def test_a_kernel_planned_at_a_small_cap_then_a_larger_one_is_complete_for_a_later_process(tmp_path, monkeypatch):
    """The largest workspaces first in the ranking, one timed per size: at no workspace every
    candidate but the last is over the cap; at 64 MiB the first is timed and the rest pruned."""
    import fakes

    monkeypatch.setitem(fakes.CANDIDATES, "legacy", dict(reversed(list(fakes.ALGORITHMS.items()))))
    path, one = tmp_path / "db.sqlite", dataclasses.replace(PRUNED_SEARCH, best=1)
    for cap in (0, 64 * MiB):
        ensure_tables([P], Settings().sizes_for, cap, Cache(path), FakeBenchmarker(), search=one)
    later = FakeBenchmarker()
    ensure_tables([P], Settings().sizes_for, 64 * MiB, Cache(path), later, search=one)
    assert later.calls == 0


def test_a_second_process_on_a_pruned_database_measures_nothing(tmp_path):
    path = tmp_path / "db.sqlite"
    first = FakeBenchmarker(backends=("legacy", "engines"))
    ensure_tables([P], Settings().sizes_for, 256 * 2**10, Cache(path), first, search=PRUNED_SEARCH)
    assert first.calls > 0
    again = FakeBenchmarker(backends=("legacy", "engines"))
    tables = ensure_tables([P], Settings().sizes_for, 256 * 2**10, Cache(path), again, search=PRUNED_SEARCH)
    assert again.calls == 0 and len(tables[P.key])
    full = FakeBenchmarker(backends=("legacy", "engines"))
    ensure_tables([P], Settings().sizes_for, 256 * 2**10, Cache(path), full, search=FULL)
    assert full.calls > 0  # the sizes the walk skipped


class Ranked:
    """A backend of five candidates ranked c0..c4: c0 and c1 need more than the cap, the others
    nothing; counts the plans it builds."""

    name, blends = "engines", False

    def __init__(self):
        self.built = []

    def ranked(self, problem):
        return [f"engines:c{i}" for i in range(5)]

    def candidate(self, problem, candidate):
        self.built.append(candidate)
        return Candidate(candidate, 64 * MiB if candidate in ("engines:c0", "engines:c1") else 0, OK)

    def prepare(self, step):
        return Plan(lambda *args: None, 0)

    def set_stream(self, stream):
        pass


@pytest.mark.parametrize("best, skip, built, timed", [(None, (), 5, 3), (3, (), 3, 1), (1, (), 3, 1),
                                                     (None, ("engines:c3",), 4, 2)])
def test_a_pruned_measurement_builds_the_first_of_the_ranking_only(monkeypatch, best, skip, built, timed):
    """best=3: c0..c2 measured (two over the cap, one timed), c3 and c4 PRUNED unbuilt; best=1:
    c0 is over the cap, so the ranking is followed on to c2, the first that runs; a candidate
    skipped is PRUNED unbuilt wherever it ranks."""
    monkeypatch.setattr(benchmark.gpu, "time_calls", lambda run, repeats, stream, hide_host=False: [1.0] * repeats)
    monkeypatch.setattr(benchmark, "_time", lambda run, timing, stream, capturer=None, estimate=None: [1.0])
    bench = object.__new__(benchmark.CudnnBenchmarker)
    bench.scratch, bench.stream, bench.pace = types.SimpleNamespace(workspace=lambda nbytes: 0), 0, gpu.HostPace()
    bench.calls, bench.timing, bench.capturer = 0, benchmark.TimingSettings(), None
    backend = Ranked()
    bench.backends = Backends([backend])
    rows = bench._measure_size(backend, P, P, dict(x=0, w=0, y=0), 8 * MiB, best, skip)
    assert [m.algo for m in rows] == backend.ranked(P)
    assert len(backend.built) == built and sum(m.status == OK for m in rows) == timed
    assert not set(skip) & set(backend.built)
    assert all(m.status == PRUNED and m.workspace == 0 for m in rows if m.algo not in backend.built)
    assert [m.status for m in rows[:2]] == [OVER_CAP, OVER_CAP]


@pytest.mark.parametrize("optimizer, sizes", [("wr", {32}), ("wd", set(SIZES))])
def test_a_network_wide_limit_measures_every_size(tmp_path, optimizer, sizes):
    """What `ucudnn optimize` measures on a GPU under the pruned search: WR walks (a roomy limit
    keeps nothing out: the whole batch alone), WD measures every size, as its total says nothing
    of one kernel's share."""
    from ucudnn.plan.sources import complete_tables

    settings = Settings.load(optimizer=optimizer, workspace_limit="1GiB")
    bench = FakeBenchmarker()
    tables = complete_tables([P], settings, settings.limit(1), Cache(tmp_path / "db.sqlite"), bench)
    assert set(tables[P.key].sizes) == sizes


def test_a_database_lists_as_recorded_only_sizes_a_full_search_completed():
    from ucudnn.reports.coverage import _complete

    t = table([(b, "A", 1.0, 0, OK) for b in (8, 16)] + [(8, "B", None, 0, PRUNED)])
    assert _complete(t, None) == {16} and _complete(t, "legacy") == {16}


def test_the_walk_skips_below_a_size_what_was_far_slower_there(tmp_path, monkeypatch):
    import fakes

    slow = {**fakes.ALGORITHMS, "legacy:SLOW": (1.0, 0.0, 0)}  # 20x legacy:A0, the same workspace
    monkeypatch.setattr(fakes, "ALGORITHMS", slow)
    monkeypatch.setitem(fakes.CANDIDATES, "legacy", slow)
    bench = FakeBenchmarker()
    tables = ensure_tables([P], Settings().sizes_for, 64 * 2**10, Cache(tmp_path / "db.sqlite"), bench,
                           search=PRUNED_SEARCH)
    rows = {m.batch: m.status for m in tables[P.key] if m.algo == "legacy:SLOW"}
    assert len(rows) > 1, "the cap must make the walk go below the whole batch"
    assert rows[32] == OK and all(status == PRUNED for b, status in rows.items() if b < 32)


def _rounds(benchmarker) -> list:
    """Each measure() call of `benchmarker` from now on, as (backend, sizes)."""
    calls, measure = [], benchmarker.measure

    def counted(problem, sizes, cap, backend=None, best=None, skip=()):
        calls.append((backend, tuple(sizes)))
        return measure(problem, sizes, cap, backend=backend, best=best, skip=skip)
    benchmarker.measure = counted
    return calls


@pytest.mark.parametrize("search", [PRUNED_SEARCH, FULL], ids=["pruned", "full"])
def test_a_sweep_within_a_spent_slice_ends_after_a_round_and_the_next_call_goes_on_from_the_table(tmp_path, search):
    """Within a slice (core.budget.within) a sweep raises OutOfTime once the slice is spent after a
    round that completed a size; the next call measures only what is left, and the table ends as
    an uncut sweep's."""
    from ucudnn.core.budget import OutOfTime, Slice, within

    backends, cap = ("legacy", "engines"), 256 * 2**10
    uncut = FakeBenchmarker(backends=backends)
    whole = _rounds(uncut)
    want = ensure_tables([P], Settings().sizes_for, cap, Cache(tmp_path / "uncut.db"), uncut, search=search)[P.key]
    cache, cut = Cache(tmp_path / "cut.db"), []
    for _ in range(len(whole) + 1):
        benchmarker = FakeBenchmarker(backends=backends)
        calls = _rounds(benchmarker)
        try:
            with within(Slice(deadline=0.0)):  # spent as soon as a round completes a size
                got = ensure_tables([P], Settings().sizes_for, cap, cache, benchmarker, search=search)[P.key]
            cut.append(calls)
            break
        except OutOfTime:
            cut.append(calls)
    assert len(cut) > 1 and all(len(calls) <= len(backends) for calls in cut)  # a round (a call a backend) a slice
    assert sorted(c for calls in cut for c in calls) == sorted(whole)  # each round once, none again
    assert sorted(got, key=str) == sorted(want, key=str)


def test_a_round_that_completes_nothing_ends_no_slice(tmp_path, monkeypatch):
    """A size left out of memory stays incomplete (a circumstance, measured again where it could
    fit): a round of only such sizes does not end the call within a spent slice, which would else
    measure it again at every slice's start; the call ends as an uncut one does (each size once)."""
    from ucudnn.core.budget import Slice, within

    benchmarker = FakeBenchmarker()
    measure = benchmarker.measure

    def out_of_memory(problem, sizes, cap, backend=None, best=None, skip=()):
        return [dataclasses.replace(m, time_ms=None, status=OUT_OF_MEMORY) for m in
                measure(problem, sizes, cap, backend=backend, best=best, skip=skip)]
    benchmarker.measure = out_of_memory
    calls = _rounds(benchmarker)
    budget = Slice(deadline=0.0)
    with within(budget):
        ensure_tables([P], Settings().sizes_for, 256 * 2**10, Cache(tmp_path / "db.sqlite"), benchmarker,
                      search=PRUNED_SEARCH)
    assert calls and not budget.worked  # measured, completed nothing, and not cut
