"""CPU: the backend seam. Candidate ids and the backend setting, engine numerics filters, the
float32 accumulation of half dW (checked with NumPy through the fakes), how measurements of
sums are taken and kept apart from whole calls, the coarse sweep's re-timing rule, and
candidates of several backends in the cache and in ensure_tables."""
from __future__ import annotations

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from ucudnn.core.accumulation import accumulates
from ucudnn.core.errors import BackendUnavailableError, ConfigError, MissingMeasurementsError
from ucudnn.core.measurements import OK, OVER_CAP, UNSUPPORTED, KernelTable, Measurement
from ucudnn.core.problem import ConvProblem
from ucudnn.execute.backends import Backends, Candidate, candidate_id, candidates, resolve, split_id
from ucudnn.measure.benchmark import ensure_tables, timing_step, worth_timing_again
from ucudnn.measure.cache import Cache
from ucudnn.measure.cache.database import BenchmarkDatabase
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.plan.config import Settings
from ucudnn.plan.sources import recorded_tables

import reference
from fakes import FAKE_DEVICE, FakeBackend


def test_candidate_ids_name_backend_and_candidate():
    assert candidate_id("engines", "eng67_k2=9") == "engines:eng67_k2=9"
    assert split_id("engines:eng67_k2=9_k13=0") == ("engines", "eng67_k2=9_k13=0")
    for bad in ("FFT", ":FFT", "legacy:", 3):
        with pytest.raises(ConfigError, match="backend:name"):
            split_id(bad)


def test_backend_setting_resolves_and_falls_back_only_when_unset():
    assert resolve("all") == ("legacy", "engines") and resolve("engines") == ("engines",)
    assert resolve("", frontend=False) == ("legacy",)  # documented default without the frontend
    assert resolve("", frontend=True) == ("legacy", "engines")
    with pytest.raises(ConfigError, match="'cuda'.*all, engines, legacy"):
        resolve("cuda")
    assert Settings.load({"UCUDNN_BACKEND": "Engines"}).backend == "engines"
    assert Settings.load({}).backends(gpu=False) == ("legacy", "engines")  # offline: any measurements
    with pytest.raises(ConfigError, match="UCUDNN_BACKEND"):
        Settings.load({"UCUDNN_BACKEND": "fast"})


def test_engines_without_the_frontend_is_a_named_error(monkeypatch):
    from ucudnn.execute.backends import engines

    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    with pytest.raises(BackendUnavailableError, match="nvidia-cudnn-frontend.*UCUDNN_BACKEND=legacy"):
        engines.frontend()


def test_math_types_exclude_tf32_and_down_conversion():
    from ucudnn.execute.backends.engines import excluded_notes

    note = types.SimpleNamespace(TENSOR_CORE="TC", DOWN_CONVERT_INPUTS="DOWN")
    fe = types.SimpleNamespace(numerical_note=note)
    kernel = lambda math, dtype="float32": ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), dtype=dtype, math=math)  # noqa: E731
    assert excluded_notes(fe, kernel("fma")) == ["TC", "DOWN"]
    assert excluded_notes(fe, kernel("default")) == ["DOWN"]  # fp32 default math allows TF32, as legacy does
    assert excluded_notes(fe, kernel("tensor_op", "float16")) == ["DOWN"]
    assert excluded_notes(fe, kernel("tensor_op_allow_conversion")) == []


def test_deterministic_kernels_exclude_nondeterministic_engines():
    from ucudnn.execute.backends.engines import excluded_notes

    note = types.SimpleNamespace(TENSOR_CORE="TC", DOWN_CONVERT_INPUTS="DOWN", NONDETERMINISTIC="NONDET")
    fe = types.SimpleNamespace(numerical_note=note)
    kernel = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), dtype="bfloat16", deterministic=True)
    assert excluded_notes(fe, kernel) == ["DOWN", "NONDET"]
    assert "NONDET" not in excluded_notes(fe, replace(kernel, deterministic=False))


def _perf(algo: int, determinism: int, status: int = 0):
    from ucudnn.execute.bindings.enums import AlgoPerf

    perf = AlgoPerf()
    perf.algo, perf.status, perf.determinism = algo, status, determinism
    return perf


@pytest.fixture
def legacy_backend(monkeypatch):
    """A LegacyBackend whose cuDNN calls are stubs: workspace = 100 x algorithm; cuDNN ranks
    backward-filter algorithms with 0 and 3 non-deterministic, as its documentation lists them."""
    from ucudnn.execute.backends import legacy

    ranked = {"calls": 0, "perfs": [_perf(a, 0 if a in (0, 3) else 1) for a in range(7)]}

    def get_algorithms(handle, kind, descs):
        ranked["calls"] += 1
        if isinstance(ranked["perfs"], Exception):
            raise ranked["perfs"]
        return ranked["perfs"]

    monkeypatch.setattr(legacy, "get_algorithms", get_algorithms)
    monkeypatch.setattr(legacy, "workspace_size", lambda handle, kind, descs, algo: 100 * algo)
    backend = legacy.LegacyBackend(handle=None)
    monkeypatch.setattr(backend.executor, "descriptors", lambda problem: {})
    return backend, ranked


def test_legacy_deterministic_kernels_offer_only_what_cudnn_reports_deterministic(legacy_backend):
    from ucudnn.core.errors import CudnnError

    backend, ranked = legacy_backend
    bf = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    assert len(candidates(backend, bf)) == 7  # no setting: every algorithm
    chosen = candidates(backend, replace(bf, deterministic=True))
    assert [c.id for c in chosen] == ["legacy:ALGO_1", "legacy:FFT", "legacy:WINOGRAD",
                                      "legacy:WINOGRAD_NONFUSED", "legacy:FFT_TILING"]
    assert [c.workspace for c in chosen] == [100, 200, 400, 500, 600]
    ranked["perfs"] = [_perf(1, 1, status=0), _perf(1, 0), _perf(2, 0)]  # a non-deterministic duplicate
    assert [c.id for c in candidates(backend, replace(bf, deterministic=True))] == ["legacy:ALGO_1"]
    ranked["perfs"] = CudnnError("cudnnGetConvolutionBackwardFilterAlgorithm_v7", 3000, "NOT_SUPPORTED")
    assert candidates(backend, replace(bf, deterministic=True)) == [Candidate("legacy:none", 0, UNSUPPORTED)]


def test_legacy_half_precision_weight_gradients_never_offer_algo_0(legacy_backend):
    """Backward-filter ALGO_0 sums half-precision values in the output's type (ucudnn.core.accuracy):
    not offered for fp16 or bf16, offered for fp32 and for the other kinds."""
    backend, _ = legacy_backend
    bf = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    for dtype in ("float16", "bfloat16"):
        offered = backend.ranked(replace(bf, dtype=dtype, math="tensor_op"))
        assert "legacy:ALGO_0" not in offered and "legacy:ALGO_1" in offered
    assert "legacy:ALGO_0" in backend.ranked(bf)
    assert "legacy:ALGO_0" in backend.ranked(replace(bf, kind="BD", dtype="float16", math="tensor_op"))


def test_engines_half_precision_weight_gradients_never_offer_engine_20():
    """Engine 20, legacy ALGO_0's kernel, is held back like it (ucudnn.core.accuracy), knobs or none."""
    from ucudnn.execute.backends.engines import EnginesBackend

    backend = EnginesBackend.__new__(EnginesBackend)
    listed = ["eng20", "eng20_k2=1", "eng200", "eng65_k2=5"]
    backend.graph = lambda problem: types.SimpleNamespace(index=dict.fromkeys(listed))
    bf = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1, dtype="bfloat16", math="tensor_op")
    assert backend.ranked(bf) == ["engines:eng200", "engines:eng65_k2=5"]
    assert len(backend.ranked(replace(bf, dtype="float32", math="default"))) == 4
    assert len(backend.ranked(replace(bf, kind="F"))) == 4


def test_legacy_candidates_come_in_cudnns_heuristic_order_then_the_rest(legacy_backend):
    """A pruned search times the first few (ucudnn.optimizers.search): cuDNN's ranking first; algorithms it
    leaves out follow in enum order; where it refuses to rank, enum order."""
    from ucudnn.core.errors import CudnnError

    backend, ranked = legacy_backend
    f = ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    ranked["perfs"] = [_perf(5, 1), _perf(1, 1), _perf(5, 1)]
    assert backend.ranked(f) == ["legacy:FFT_TILING", "legacy:IMPLICIT_PRECOMP_GEMM", "legacy:IMPLICIT_GEMM",
                                 "legacy:GEMM", "legacy:DIRECT", "legacy:FFT", "legacy:WINOGRAD",
                                 "legacy:WINOGRAD_NONFUSED"]
    assert backend.candidate(f, "legacy:FFT_TILING") == Candidate("legacy:FFT_TILING", 500, OK)
    ranked["perfs"] = CudnnError("cudnnGetConvolutionForwardAlgorithm_v7", 3000, "NOT_SUPPORTED")
    assert backend.ranked(f)[:2] == ["legacy:IMPLICIT_GEMM", "legacy:IMPLICIT_PRECOMP_GEMM"]


def test_deterministic_kernels_are_measured_and_cached_apart(tmp_path):
    """Measurements of a kernel that allows every candidate never complete the deterministic
    kernel's table, which only the filtered candidates fill."""
    p = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    strict = replace(p, deterministic=True)
    cache = Cache(tmp_path / "db.sqlite")
    cache.record(p, FAKE_DEVICE, [Measurement("legacy:ALGO_0", b, 1.0, 0, OK, 3, accumulates(p, b))
                                  for b in (1, 2, 4, 8)])
    bench = TwoBackendBenchmarker(("legacy",))
    tables = ensure_tables([p, strict], Settings().sizes_for, None, cache, bench)
    assert bench.asked == [("legacy", (1, 2, 4, 8))]  # the deterministic kernel's only
    assert {m.algo for m in tables[strict.key]} == {"legacy:x"}
    assert {m.algo for m in tables[p.key]} == {"legacy:ALGO_0"}
    with BenchmarkDatabase(tmp_path / "db.sqlite", readonly=True) as db:
        assert sorted(k.deterministic for k, _ in db.kernels(FAKE_DEVICE)) == [False, True]


def test_engine_tensor_strides_follow_the_layout():
    from ucudnn.execute.backends.engines import strides

    assert strides((2, 3, 4, 5), "nchw") == [60, 20, 5, 1]
    assert strides((2, 3, 4, 5), "nhwc") == [60, 1, 15, 3]
    assert strides((2, 3, 4, 5, 6), "nhwc") == [360, 1, 90, 18, 3]


@pytest.mark.parametrize("algo", ["legacy:A0", "engines:E0"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0), (2.0, -0.5)])
def test_half_dw_partials_are_summed_in_float32(algo, alpha, beta):
    """64 one-sample parts of an fp16 dW, on either backend: one rounding at the end, 4x more
    accurate than summing in the half output."""
    from executors import dispatch

    rng = np.random.default_rng(0)
    problem = ConvProblem("BF", (64, 16, 8, 8), (16, 16, 3, 3), pads=1, dtype="float16")
    operands = {r: rng.uniform(-1, 1, int(np.prod(s))).astype(np.float16)
                for r, s in (("x", problem.x_shape), ("w", problem.w_shape), ("y", problem.y_shape))}
    prior = operands["w"].astype(np.float64)
    parts = [reference.backward_filter(problem.with_batch(1), *(reference.to_logical(
        operands[r].reshape(reference.stored_shape(s, "nchw"))[i:i + 1], "nchw") for r, s in
        (("x", problem.x_shape), ("y", problem.y_shape)))).ravel() for i in range(64)]
    want = alpha * np.sum(parts, axis=0) + beta * prior
    dispatch(problem, Configuration(tuple(MicroConfig(algo, 1, 0.0, 0) for _ in range(64))),
             operands["x"], operands["w"], operands["y"], alpha, beta)
    naive = np.float16(beta) * prior.astype(np.float16)  # summing in the half output instead
    for p in parts:
        naive = (naive + np.float16(alpha) * p.astype(np.float16)).astype(np.float16)
    error = lambda x: np.linalg.norm(x.astype(np.float64) - want) / np.linalg.norm(want)  # noqa: E731
    assert error(operands["w"]) <= 1e-3  # the parts' own roundings and one at the end
    assert error(operands["w"]) * 4 < error(naive)


def test_measurements_of_parts_include_the_buffers_of_the_sum():
    half = ConvProblem("BF", (8, 16, 8, 8), (32, 16, 3, 3), pads=1, dtype="float16")
    blends = lambda algo: algo.startswith("legacy")  # noqa: E731
    assert not accumulates(half, 8) and accumulates(half, 4) and not accumulates(half.with_kind("F"), 4)
    for algo in ("legacy:ALGO_0", "engines:eng0"):  # half: a partial (fp16) and the accumulator (fp32)
        assert timing_step(half, 4, algo, blends).route.buffer_bytes == 9216 + 18432
        assert timing_step(half, 8, algo, blends).route.buffer_bytes == 0  # the whole call
    single = half.__class__("BF", (8, 16, 8, 8), (32, 16, 3, 3), pads=1)
    assert timing_step(single, 4, "engines:eng0", blends).route.buffer_bytes == 18432  # the partial: dw is its own sum
    assert timing_step(single, 4, "legacy:ALGO_0", blends).route.buffer_bytes == 0  # adds into dw itself


def test_timing_step_times_backward_filter_parts_as_a_middle_part_of_a_sum():
    p = ConvProblem("BF", (64, 8, 6, 6), (8, 8, 3, 3), pads=1)
    blends = lambda algo: True  # noqa: E731
    part = timing_step(p, 16, "legacy:ALGO_0", blends)
    assert part.accumulates and (part.part, part.parts) == (1, 3)
    assert part.route.beta == 1.0  # legacy float32: adds with beta = 1, as dispatched
    assert not timing_step(p, 64, "legacy:ALGO_0", blends).accumulates
    assert not timing_step(p.with_kind("F"), 16, "legacy:GEMM", blends).accumulates
    half = replace(p, dtype="float16")
    combines = timing_step(half, 16, "legacy:ALGO_0", blends).route.combines
    assert [(c.src, c.dst, c.beta) for c in combines] == [("partial", "accumulator", 1.0)]  # no final write


def test_only_candidates_that_can_still_win_are_timed_again():
    m = lambda algo, ms, ws, status=OK: Measurement(algo, 8, ms, ws, status)  # noqa: E731
    coarse = [m("a", 1.00, 0), m("b", 1.20, 10), m("c", 2.00, 10), m("d", 0.50, 100), m("e", 0.55, 200),
              m("f", 0.70, 300), m("g", None, 0, OVER_CAP)]
    # a: smallest workspace; b: within 1.25x of a; c: beaten by a by 2x; d: fastest; e: within 1.25x of d;
    # f: 1.4x d with more workspace: cannot win
    assert worth_timing_again(coarse) == ["a", "b", "d", "e"]
    assert worth_timing_again([]) == []


class TwoBackendBenchmarker:
    """Measures one candidate per backend; counts what it was asked for."""

    device = FAKE_DEVICE

    def __init__(self, names=("legacy", "engines")):
        self.backends = Backends([FakeBackend(n) for n in names])
        self.asked: list[tuple[str, tuple[int, ...]]] = []

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        self.asked.append((backend, tuple(sizes)))
        ms = {"legacy": 2.0, "engines": 1.0}[backend]
        return [Measurement(candidate_id(backend, "x"), b, ms * b, 0, OK, 3, accumulates(problem, b)) for b in sizes]


def test_ensure_tables_measures_only_the_backend_the_cache_lacks(tmp_path):
    p = ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    cache = Cache(tmp_path / "db.sqlite")
    cache.record(p, FAKE_DEVICE, [Measurement("legacy:x", b, 2.0 * b, 0, OK, 3) for b in (1, 2, 4, 8)])
    bench = TwoBackendBenchmarker()
    tables = ensure_tables([p], Settings().sizes_for, None, cache, bench)
    assert bench.asked == [("engines", (1, 2, 4, 8))]
    assert {m.algo for m in tables[p.key]} == {"legacy:x", "engines:x"}
    legacy_only = ensure_tables([p], Settings().sizes_for, None, cache, TwoBackendBenchmarker(("legacy",)))
    assert {m.algo for m in legacy_only[p.key]} == {"legacy:x"}


def test_offline_tables_use_the_backends_asked_for(tmp_path):
    p = ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    path = tmp_path / "db.sqlite"
    with BenchmarkDatabase(path) as db:
        db.record(p, FAKE_DEVICE, [Measurement("legacy:x", b, 1.0, 0) for b in (1, 2, 4, 8)])
    with BenchmarkDatabase(path, readonly=True) as db:
        found = recorded_tables([p], Settings(backend="all"), None, db, FAKE_DEVICE)
        assert len(found[p.key]) == 4
        with pytest.raises(MissingMeasurementsError, match="of backend engines"):
            recorded_tables([p], Settings(backend="engines"), None, db, FAKE_DEVICE)


def test_the_key_holds_the_backend_and_the_row_the_frontend_version(tmp_path):
    import dataclasses
    import sqlite3

    p = ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    device = dataclasses.replace(FAKE_DEVICE, frontend_version="1.32.0")
    with BenchmarkDatabase(tmp_path / "db.sqlite") as db:
        db.record(p, device, [Measurement("legacy:eng0", 8, 2.0, 0), Measurement("engines:eng0", 8, 1.0, 64)])
        assert sorted(db.table(p, FAKE_DEVICE), key=lambda m: m.algo) == [
            Measurement("engines:eng0", 8, 1.0, 64), Measurement("legacy:eng0", 8, 2.0, 0)]
        assert db.devices()[0].frontend_version == "1.32.0"
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        rows = conn.execute("SELECT backend, algo, frontend_version FROM measurements ORDER BY backend").fetchall()
    assert rows == [("engines", "eng0", "1.32.0"), ("legacy", "eng0", "1.32.0")]


def test_a_table_keeps_the_candidates_of_the_backends_asked_for():
    table = KernelTable([Measurement("legacy:a", 1, 1.0, 0), Measurement("engines:b", 1, 0.5, 0)])
    assert [m.algo for m in table.only(["engines"])] == ["engines:b"]
    assert table.only(None) is table


# --- one cuDNN handle for every backend (each holds ~10 MiB of device memory) ----------------------

class FakeFrontend(types.SimpleNamespace):
    """nvidia-cudnn-frontend's handle calls, as 1.2x and later have them: handles are
    `cudnn.Handle` objects that cache their stream (`handle_class=None`: bare ints, as before)."""

    def __init__(self, handle_class=True):
        super().__init__(created=[], destroyed=[], streams=[])
        if handle_class:
            self.Handle = lambda address, ordinal, stream: types.SimpleNamespace(
                backend_handle=address, ordinal=ordinal, stream=stream)

    def create_handle(self):
        self.created.append(1000 + len(self.created))
        return self.created[-1]

    def set_stream(self, handle, stream) -> None:
        self.streams.append(stream)

    def destroy_handle(self, handle) -> None:
        self.destroyed.append(handle)


@pytest.fixture
def shared_cudnn(monkeypatch):
    """The legacy bindings' handle calls, on a dict: the stream of each handle."""
    from ucudnn.execute.backends import engines

    streams = {}
    monkeypatch.setattr(engines.bindings, "get_stream", lambda handle: streams.get(handle.value, 0))
    monkeypatch.setattr(engines.bindings, "set_stream", lambda handle, stream: streams.update({handle.value: stream}))
    monkeypatch.setattr(engines.gpu, "cupy", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0))))
    return streams


@pytest.mark.parametrize("handle_class", [True, False])
@pytest.mark.parametrize("copies, shared", [(1, True), (2, False), (0, False)])
def test_the_engines_run_on_the_legacy_handle_only_where_one_libcudnn_is_loaded(
        monkeypatch, shared_cudnn, copies, shared, handle_class):
    import ctypes

    from ucudnn.execute.backends import engines

    fe = FakeFrontend(handle_class)
    monkeypatch.setattr(engines, "frontend", lambda: fe)
    monkeypatch.setattr(engines.library, "copies_loaded", lambda: copies)
    backend = engines.EnginesBackend(ctypes.c_void_p(0xABC0))
    address = getattr(backend.handle, "backend_handle", backend.handle)
    assert (address == 0xABC0) is shared and backend.owns_handle is not shared
    assert fe.created == ([] if shared else [1000])
    backend.close()
    assert fe.destroyed == ([] if shared else [1000])  # never the legacy backend's handle
    assert engines.EnginesBackend().owns_handle  # no handle given: its own


def test_a_shared_handle_is_moved_to_the_stream_asked_for_whatever_the_frontend_cached(monkeypatch, shared_cudnn):
    import ctypes

    from ucudnn.execute.backends import engines

    fe = FakeFrontend()
    monkeypatch.setattr(engines, "frontend", lambda: fe)
    monkeypatch.setattr(engines.library, "copies_loaded", lambda: 1)
    shared_cudnn[0xABC0] = 5
    backend = engines.EnginesBackend(ctypes.c_void_p(0xABC0))
    assert backend.handle.stream == 5 and backend.handle.ordinal == 0  # wrapped as it stands
    backend.set_stream(7)
    shared_cudnn[0xABC0] = 9  # the legacy backend moves the handle; the frontend's cache still says 7
    backend.set_stream(7)
    assert shared_cudnn[0xABC0] == 7 and backend.handle.stream == 7 and fe.streams == []


def test_loaded_cudnn_copies_are_counted_by_file_not_by_mapping(monkeypatch, tmp_path):
    from ucudnn.execute.bindings import library

    maps = tmp_path / "maps"
    lines = ["7f00-7f10 r--p 00000000 fd:01 111 /site/nvidia/cudnn/lib/libcudnn.so.9",
             "7f10-7f20 r-xp 00001000 fd:01 111 /site/nvidia/cudnn/lib/libcudnn.so.9",
             "7f30-7f40 r--p 00000000 fd:01 222 /usr/lib/libcudnn_graph.so.9",
             "7f50-7f60 rw-p 00000000 00:00 0 ",
             "7f60-7f70 r--p 00000000 fd:02 333 /other/libcudnn.so.9.19.0"]
    real_path = library.Path
    monkeypatch.setattr(library, "Path", lambda p: maps if p == "/proc/self/maps" else real_path(p))
    maps.write_text("\n".join(lines[:4]) + "\n")
    assert library.copies_loaded() == 1 and library._already_loaded() == "/site/nvidia/cudnn/lib/libcudnn.so.9"
    maps.write_text("\n".join(lines) + "\n")
    assert library.copies_loaded() == 2


def test_a_benchmarker_leaves_a_borrowed_handle_on_the_stream_it_found(monkeypatch):
    from ucudnn.execute.bindings import cudnn
    from ucudnn.measure import benchmark

    streams = {"handle": 7}
    monkeypatch.setattr(cudnn, "get_stream", lambda handle: streams["handle"])
    monkeypatch.setattr(cudnn, "set_stream", lambda handle, stream: streams.update(handle=stream))
    with pytest.raises(RuntimeError):
        with benchmark._stream_kept("h"):
            streams["handle"] = 99  # measuring on the benchmarker's stream ...
            raise RuntimeError("a measurement failed")
    assert streams["handle"] == 7  # ... and back on the owner's, even after a failure


def test_a_call_cudnn_refuses_is_unsupported_and_one_that_fails_to_run_is_failed():
    """cuDNN 9 groups its status codes by thousands: 2xxx BAD_PARAM and 3xxx NOT_SUPPORTED say
    the candidate cannot compute the problem; 4xxx INTERNAL_ERROR and 5xxx EXECUTION_FAILED that
    it failed to run it."""
    from ucudnn.core.errors import CudnnError
    from ucudnn.core.measurements import FAILED, failure_status

    statuses = {2000: UNSUPPORTED, 3007: UNSUPPORTED, 4000: FAILED, 5003: FAILED}
    assert {s: failure_status(CudnnError("cudnnConvolutionForward", s, "")) for s in statuses} == statuses
    assert failure_status(RuntimeError("not cuDNN's")) == FAILED
