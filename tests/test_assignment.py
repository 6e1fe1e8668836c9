"""CPU: what a handle does with kernels (WR memo, WD deferral, late kernels, workspaces), and the
whole path from plan to dispatch checked against the float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.measure.cache import Cache
from ucudnn.plan.assignment import Assignments
from ucudnn.plan.config import Settings

import reference
from executors import dispatch
from fakes import FAKE_DEVICE, FakeAllocator, FakeBenchmarker

LAYERS = [ConvProblem(kind, (32, 16, 12, 12), (24, 16, 3, 3), pads=1) for kind in ConvKind] + [
    ConvProblem("F", (32, 24, 12, 12), (8, 24, 1, 1))]


def make_assignments(tmp_path, bench=None, **settings):
    bench = bench or FakeBenchmarker()
    allocator = FakeAllocator()
    assignments = Assignments(Settings.load(env={}, **settings), Cache(tmp_path / "bench.db"), lambda: bench,
                  allocator, pointer=lambda address: address)
    return assignments, bench, allocator


def test_wr_plans_each_kernel_once_within_its_limit(tmp_path):
    assignments, bench, allocator = make_assignments(tmp_path, workspace_limit="256KiB", search="full")
    for p in LAYERS * 3:
        assignments.record(p)
        plan = assignments.get(p)
        assert plan.configuration.batch == p.batch
        assert plan.workspace_size == plan.configuration.workspace <= 256 * 2**10
    assert len(assignments) == len(LAYERS)
    assert len(allocator.sizes) == sum(1 for p in LAYERS if assignments.get(p).workspace_size)
    assert bench.calls == len(LAYERS) * 6 * 3  # 6 power-of-two sizes of 32, 3 algorithms, once each


def test_the_pruned_search_plans_as_the_full_one_with_fewer_measurements(tmp_path):
    plans, calls = {}, {}
    for search in ("full", "pruned"):
        assignments, bench, _ = make_assignments(tmp_path / search, workspace_limit="256KiB", search=search)
        plans[search] = [assignments.get(p).configuration for p in LAYERS]
        calls[search] = bench.calls
    assert plans["pruned"] == plans["full"]
    assert calls["pruned"] < calls["full"]


def test_wd_measures_every_size_of_the_policy_under_the_pruned_search(tmp_path):
    """WD's cap is the network's total, which keeps nothing out of one kernel: a walk would stop
    at the whole batch, and the division could not micro-batch."""
    assignments, bench, _ = make_assignments(tmp_path, optimizer="wd", total_limit="1GiB")
    assignments.get(LAYERS[0])
    assert {m.batch for m in assignments.cache.table(LAYERS[0], bench.device)} == {1, 2, 4, 8, 16, 32}


def test_tight_limit_splits_the_batch(tmp_path):
    assignments, _, _ = make_assignments(tmp_path, workspace_limit="256KiB")
    assert len(assignments.get(LAYERS[0]).configuration.micro) > 1
    loose, _, _ = make_assignments(tmp_path / "loose", workspace_limit="1GiB")
    assert len(loose.get(LAYERS[0]).configuration.micro) == 1


def test_wd_waits_for_the_network_then_divides_one_buffer(tmp_path):
    assignments, bench, allocator = make_assignments(tmp_path, optimizer="wd", total_limit="1MiB")
    for p in LAYERS:
        assignments.record(p)
    assert len(assignments) == 0 and bench.calls == 0  # only recorded
    first = assignments.get(LAYERS[0])  # the first convolution solves the whole network
    assert len(assignments) == len(LAYERS) and assignments.wd_result.variables >= len(LAYERS)
    assert allocator.sizes == [assignments.wd_result.total_workspace] and sum(allocator.sizes) <= 2**20
    segments = sorted((assignments.get(p).workspace, assignments.get(p).workspace_size) for p in LAYERS if assignments.get(p).workspace_size)
    for (start, size), (next_start, _) in zip(segments, segments[1:]):
        assert start + size <= next_start
    assert first.configuration.batch == 32


def test_wd_late_kernel_gets_only_what_is_left(tmp_path):
    assignments, _, allocator = make_assignments(tmp_path, optimizer="wd", total_limit="1MiB")
    with_network = LAYERS[:3]
    for p in with_network:
        assignments.record(p)
    assignments.finalize()
    used = assignments.wd_result.total_workspace
    late = assignments.get(LAYERS[3])
    assert late.workspace_size <= 2**20 - used
    assert sum(allocator.sizes) <= 2**20


def test_reset_solves_all_known_kernels_together(tmp_path):
    assignments, _, _ = make_assignments(tmp_path, optimizer="wd", total_limit="1MiB")
    for p in LAYERS[:3]:
        assignments.get(p)  # first one solves a network of one kernel; the others come late
    assignments.reset()
    assignments.get(LAYERS[0])
    assert set(assignments.wd_result.configurations) == {p.key for p in LAYERS[:3]}


def test_second_process_with_same_device_benchmarks_nothing(tmp_path):
    first, bench1, _ = make_assignments(tmp_path)
    for p in LAYERS:
        first.get(p)
    second, bench2, _ = make_assignments(tmp_path)  # fresh memo, same file, same GPU and cuDNN
    for p in LAYERS:
        assert second.get(p).configuration == first.get(p).configuration
    assert bench1.calls > 0 and bench2.calls == 0
    other_cudnn = FakeBenchmarker(device=FAKE_DEVICE.__class__("Fake GPU", "0.0", 90100))
    third, bench3, _ = make_assignments(tmp_path, bench=other_cudnn)
    third.get(LAYERS[0])
    assert bench3.calls > 0


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
def test_planned_dispatch_matches_reference(tmp_path, kind, rng):
    assignments, _, _ = make_assignments(tmp_path, workspace_limit="20KiB", policy="all")
    p = ConvProblem(kind, (13, 4, 7, 7), (6, 2, 3, 3), pads=1, strides=2, groups=2, dtype="float64")
    configuration = assignments.get(p).configuration
    assert len(configuration.micro) > 1
    host = {r: rng.uniform(-1, 1, s) for r, s in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape))}
    flat = {r: a.ravel().copy() for r, a in host.items()}
    dispatch(p, configuration, flat["x"], flat["w"], flat["y"], 2.0, 0.5)
    out = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}[kind]
    want = 2.0 * reference.convolve(p, host["x"], host["w"], host["y"]) + 0.5 * host[out]
    np.testing.assert_allclose(flat[out].reshape(want.shape), want, rtol=1e-12, atol=1e-12)


def test_benchmark_scratch_gives_its_memory_back(monkeypatch):
    """Benchmarking allocates the largest workspaces there are; once a kernel is measured, the
    scratch frees them and empties CuPy's pool, so a training run does not keep them."""
    from ucudnn.execute import gpu
    from ucudnn.measure import benchmark

    class Buffer:
        def __init__(self, nbytes):
            self.mem, self.ptr = type("Mem", (), {"size": nbytes})(), 4096

    freed = []
    monkeypatch.setattr(gpu, "alloc", Buffer)
    monkeypatch.setattr(gpu, "random_array", lambda shape, dtype, seed: Buffer(0))
    monkeypatch.setattr(gpu, "pointer", lambda buffer: buffer.ptr)
    monkeypatch.setattr(gpu, "free_pool", lambda: freed.append(True))
    scratch = benchmark.Scratch()
    scratch.operands(ConvProblem("F", (4, 3, 8, 8), (2, 3, 3, 3)))
    scratch.workspace(1 << 30)
    scratch.release()
    assert freed and scratch._workspace is None and scratch._operands == {}


def test_verbose_says_each_plan_as_it_is_made(tmp_path, capsys, ucudnn_stderr):
    for optimizer, verbose in (("wr", True), ("wd", True), ("wr", False)):
        assignments, _, _ = make_assignments(tmp_path / f"{optimizer}{verbose}", workspace_limit="256KiB",
                                             optimizer=optimizer, verbose=verbose)
        for p in LAYERS:
            assignments.record(p)
        got = [assignments.get(p) for p in LAYERS]
        lines = capsys.readouterr().err.splitlines()
        if not verbose:
            assert lines == []
            continue
        assert sorted(lines) == sorted(f"ucudnn: {p.describe()}: {plan.configuration.describe()}, "
                                       f"{plan.workspace_size / 2**20:.1f} MiB of workspace, "
                                       f"{plan.configuration.time_ms:.3f} ms predicted" for p, plan in zip(LAYERS, got))
