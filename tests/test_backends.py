"""CPU: the backend seam. Candidate ids and the backend setting, engine numerics filters, the
partial sums of engine calls (float32 accumulation of half dW, checked with NumPy), the coarse
sweep's re-timing rule, and candidates of several backends in the cache and in ensure_tables."""
from __future__ import annotations

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from fakes import FAKE_DEVICE, FakeBackend
from ucudnn.backends import Backends, Candidate, candidate_id, partials, resolve, split_id
from ucudnn.benchmark import ensure_tables, timing_step, worth_timing_again
from ucudnn.cache import Cache
from ucudnn.cache.database import BenchmarkDatabase
from ucudnn.config import Settings
from ucudnn.dispatch import steps
from ucudnn.errors import BackendUnavailableError, ConfigError, MissingMeasurementsError
from ucudnn.measurements import OK, OVER_CAP, UNSUPPORTED, KernelTable, Measurement
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.problem import ConvProblem


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
    from ucudnn.backends import engines

    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    with pytest.raises(BackendUnavailableError, match="nvidia-cudnn-frontend.*UCUDNN_BACKEND=legacy"):
        engines.frontend()


def test_math_types_exclude_tf32_and_down_conversion():
    from ucudnn.backends.engines import excluded_notes

    note = types.SimpleNamespace(TENSOR_CORE="TC", DOWN_CONVERT_INPUTS="DOWN")
    fe = types.SimpleNamespace(numerical_note=note)
    kernel = lambda math, dtype="float32": ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), dtype=dtype, math=math)  # noqa: E731
    assert excluded_notes(fe, kernel("fma")) == ["TC", "DOWN"]
    assert excluded_notes(fe, kernel("default")) == ["DOWN"]  # fp32 default math allows TF32, as legacy does
    assert excluded_notes(fe, kernel("tensor_op", "float16")) == ["DOWN"]
    assert excluded_notes(fe, kernel("tensor_op_allow_conversion")) == []


def test_deterministic_kernels_exclude_nondeterministic_engines():
    from ucudnn.backends.engines import excluded_notes

    note = types.SimpleNamespace(TENSOR_CORE="TC", DOWN_CONVERT_INPUTS="DOWN", NONDETERMINISTIC="NONDET")
    fe = types.SimpleNamespace(numerical_note=note)
    kernel = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), dtype="bfloat16", deterministic=True)
    assert excluded_notes(fe, kernel) == ["DOWN", "NONDET"]
    assert "NONDET" not in excluded_notes(fe, replace(kernel, deterministic=False))


def _perf(algo: int, determinism: int, status: int = 0):
    from ucudnn.bindings.enums import AlgoPerf

    perf = AlgoPerf()
    perf.algo, perf.status, perf.determinism = algo, status, determinism
    return perf


@pytest.fixture
def legacy_backend(monkeypatch):
    """A LegacyBackend whose cuDNN calls are stubs: workspace = 100 x algorithm; cuDNN ranks
    backward-filter algorithms with 0 and 3 non-deterministic, as its documentation lists them."""
    from ucudnn.backends import legacy

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
    from ucudnn.errors import CudnnError

    backend, ranked = legacy_backend
    bf = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    assert len(backend.candidates(bf, 8)) == 7 and ranked["calls"] == 0  # no setting: every algorithm
    chosen = backend.candidates(replace(bf, deterministic=True), 8)
    assert [c.id for c in chosen] == ["legacy:ALGO_1", "legacy:FFT", "legacy:WINOGRAD",
                                      "legacy:WINOGRAD_NONFUSED", "legacy:FFT_TILING"]
    assert [c.workspace for c in chosen] == [100, 200, 400, 500, 600]
    ranked["perfs"] = [_perf(1, 1, status=0), _perf(1, 0), _perf(2, 0)]  # a non-deterministic duplicate
    assert [c.id for c in backend.candidates(replace(bf, deterministic=True), 8)] == ["legacy:ALGO_1"]
    ranked["perfs"] = CudnnError("cudnnGetConvolutionBackwardFilterAlgorithm_v7", 3000, "NOT_SUPPORTED")
    assert backend.candidates(replace(bf, deterministic=True), 8) == [Candidate("legacy:none", 0, UNSUPPORTED)]


def test_deterministic_kernels_are_measured_and_cached_apart(tmp_path):
    """Measurements of a kernel that allows every candidate never complete the deterministic
    kernel's table, which only the filtered candidates fill."""
    p = ConvProblem("BF", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    strict = replace(p, deterministic=True)
    cache = Cache(tmp_path / "db.sqlite")
    cache.record(p, FAKE_DEVICE, [Measurement("legacy:ALGO_0", b, 1.0, 0, OK, 3) for b in (1, 2, 4, 8)])
    bench = TwoBackendBenchmarker(("legacy",))
    tables = ensure_tables([p, strict], Settings().sizes_for, None, cache, bench)
    assert bench.asked == [("legacy", (1, 2, 4, 8))]  # the deterministic kernel's only
    assert {m.algo for m in tables[strict.key]} == {"legacy:x"}
    assert {m.algo for m in tables[p.key]} == {"legacy:ALGO_0"}
    with BenchmarkDatabase(tmp_path / "db.sqlite", readonly=True) as db:
        assert sorted(k.deterministic for k, _ in db.kernels(FAKE_DEVICE)) == [False, True]


def test_engine_tensor_strides_follow_the_layout():
    from ucudnn.backends.engines import strides

    assert strides((2, 3, 4, 5), "nchw") == [60, 20, 5, 1]
    assert strides((2, 3, 4, 5), "nhwc") == [60, 1, 15, 3]
    assert strides((2, 3, 4, 5, 6), "nhwc") == [360, 1, 90, 18, 3]


def _run_parts(problem: ConvProblem, parts: list[np.ndarray], alpha: float, beta: float, prior: np.ndarray):
    """Emulate the engine executor's partial sums with NumPy: each part's plan writes its partial
    in the kernel's dtype, Combine steps add in float32 (storage rounds to the output dtype)."""
    configuration = Configuration(tuple(MicroConfig("engines:e", 1, 0.0, 0) for _ in parts))
    whole = problem.with_batch(len(parts))
    out = prior.astype(problem.dtype)
    accumulator = np.full(out.shape, np.nan, np.float32)  # garbage: must never be read first
    for step, partial in zip(steps(whole, configuration, alpha, beta), parts):
        buffers = {"output": out, "accumulator": accumulator, "partial": partial.astype(problem.dtype)}
        target, combines = partials.route(step)
        assert target == "partial"
        for c in combines:
            src = buffers[c.src].astype(np.float32)
            acc = np.float32(c.alpha) * src
            if c.beta != 0:
                acc = acc + np.float32(c.beta) * buffers[c.dst].astype(np.float32)
            buffers[c.dst][...] = acc.astype(buffers[c.dst].dtype)
    return out


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0), (2.0, -0.5)])
def test_half_dw_partials_are_summed_in_float32(alpha, beta):
    rng = np.random.default_rng(0)
    problem = ConvProblem("BF", (64, 16, 8, 8), (16, 16, 3, 3), pads=1, dtype="float16")
    parts = [rng.uniform(-1, 1, problem.w_shape) for _ in range(64)]  # 64 one-sample partials
    prior = rng.uniform(-1, 1, problem.w_shape)
    want = alpha * np.sum([p.astype(np.float16).astype(np.float64) for p in parts], axis=0) + beta * prior.astype(np.float16)
    got = _run_parts(problem, parts, alpha, beta, prior).astype(np.float64)
    naive = prior.astype(np.float16) * np.float16(beta)  # summing in the half output instead
    for p in parts:
        naive = (naive + np.float16(alpha) * p.astype(np.float16)).astype(np.float16)
    error = lambda x: np.linalg.norm(x - want) / np.linalg.norm(want)  # noqa: E731
    assert error(got) <= 1e-3  # one rounding to fp16 at the end
    assert error(got) * 4 < error(naive.astype(np.float64))


def test_float32_partials_add_into_dw_with_the_callers_beta_first():
    problem = ConvProblem("BF", (3, 2, 4, 4), (2, 2, 3, 3), pads=1)
    parts = [np.full(problem.w_shape, v) for v in (1.0, 2.0, 4.0)]
    got = _run_parts(problem, parts, 2.0, 0.5, np.full(problem.w_shape, 10.0))
    assert np.all(got == 2.0 * 7.0 + 0.5 * 10.0)


def test_routes_write_in_place_only_where_nothing_blends_or_adds():
    f = ConvProblem("F", (4, 2, 4, 4), (2, 2, 3, 3), pads=1)
    one = Configuration((MicroConfig("engines:e", 4, 0.0, 0),))
    two = Configuration((MicroConfig("engines:e", 2, 0.0, 0),) * 2)
    assert [partials.route(s) for s in steps(f, two)] == [("output", []), ("output", [])]
    blended = partials.route(steps(f, one, 1.0, 0.5)[0])
    assert blended == ("partial", [partials.Combine("partial", "output", 1.0, 0.5)])
    assert partials.route(steps(f.with_kind("BF"), one)[0]) == ("output", [])  # one part: no sum


def test_buffers_of_accumulating_calls_count_as_workspace():
    half = ConvProblem("BF", (8, 16, 8, 8), (32, 16, 3, 3), pads=1, dtype="float16")
    w_bytes = 32 * 16 * 9 * 2
    assert not partials.accumulates(half, 8) and partials.buffer_bytes(half, False) == 0
    assert partials.accumulates(half.with_batch(4), 8)
    assert partials.buffer_bytes(half, True) == 9216 + 18432  # partial (fp16) + accumulator (fp32), aligned
    single = ConvProblem("BF", (8, 16, 8, 8), (32, 16, 3, 3), pads=1)
    assert partials.buffer_bytes(single, True) == 2 * w_bytes  # fp32: the partial only; dw is its own sum
    assert partials.offsets(half, True) == {"partial": 0, "accumulator": 9216, "plan": 27648}
    assert not partials.accumulates(half.with_kind("F").with_batch(4), 8)


def test_timing_step_times_backward_filter_parts_as_accumulating():
    p = ConvProblem("BF", (64, 8, 6, 6), (8, 8, 3, 3), pads=1)
    assert timing_step(p, p.with_batch(16), "legacy:ALGO_0").accumulates
    assert timing_step(p, p.with_batch(16), "legacy:ALGO_0").call_beta == 1.0  # legacy: beta = 1, as dispatched
    assert not timing_step(p, p, "legacy:ALGO_0").accumulates
    assert not timing_step(p.with_kind("F"), p.with_batch(16).with_kind("F"), "legacy:GEMM").accumulates


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

    def measure(self, problem, sizes, cap, backend=None):
        self.asked.append((backend, tuple(sizes)))
        ms = {"legacy": 2.0, "engines": 1.0}[backend]
        return [Measurement(candidate_id(backend, "x"), b, ms * b, 0, OK, 3) for b in sizes]


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
        found = ensure_tables([p], Settings().sizes_for, None, db, None, device=FAKE_DEVICE,
                              backends=("legacy", "engines"))
        assert len(found[p.key]) == 4
        with pytest.raises(MissingMeasurementsError, match="of backend engines"):
            ensure_tables([p], Settings().sizes_for, None, db, None, device=FAKE_DEVICE, backends=("engines",))


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
    from ucudnn.backends import engines

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

    from ucudnn.backends import engines

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

    from ucudnn.backends import engines

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
    from ucudnn.bindings import library

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
    from ucudnn import benchmark
    from ucudnn.bindings import cudnn

    streams = {"handle": 7}
    monkeypatch.setattr(cudnn, "get_stream", lambda handle: streams["handle"])
    monkeypatch.setattr(cudnn, "set_stream", lambda handle, stream: streams.update(handle=stream))
    with pytest.raises(RuntimeError):
        with benchmark._stream_kept("h"):
            streams["handle"] = 99  # measuring on the benchmarker's stream ...
            raise RuntimeError("a measurement failed")
    assert streams["handle"] == 7  # ... and back on the owner's, even after a failure
