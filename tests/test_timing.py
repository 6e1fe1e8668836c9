"""How ucudnn times GPU calls for a sweep, on fakes of the CUDA runtime and of the benchmarker's
candidates (the real ones: tests/test_gpu_engines.py)."""
from __future__ import annotations

import types

import pytest

from ucudnn.core.measurements import OK, Measurement
from ucudnn.core.problem import ConvProblem
from ucudnn.execute import gpu
from ucudnn.execute.backends import Backends, Candidate
from ucudnn.execute.dispatch import Plan
from ucudnn.measure import benchmark


class FakeRuntime:
    """Events on a fake GPU clock: each run() adds its GPU milliseconds; the clock is read at
    eventRecord, as the GPU would when it reaches the event."""

    def __init__(self):
        self.clock, self.stamps, self.created, self.destroyed = 0.0, {}, 0, []

    def eventCreate(self):
        self.created += 1
        return self.created

    def eventRecord(self, event, stream):
        self.stamps[event] = self.clock

    def eventSynchronize(self, event):
        pass

    def eventElapsedTime(self, start, end):
        return self.stamps[end] - self.stamps[start]

    def eventDestroy(self, event):
        self.destroyed.append(event)


@pytest.fixture
def runtime(monkeypatch):
    fake = FakeRuntime()
    monkeypatch.setattr(gpu, "cupy", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=fake)))
    return fake


def test_timed_calls_read_the_events_and_free_them(runtime, monkeypatch):
    spins = []
    monkeypatch.setattr(gpu, "spin", lambda ms, stream: spins.append(ms))
    gpu_ms = iter([2.0, 3.0, 5.0])

    def run():
        runtime.clock += next(gpu_ms)

    times, queued_ms = gpu._timed(run, 3, stream=0, spin_ms=0.7)
    assert times == [2.0, 3.0, 5.0] and spins == [0.7] and queued_ms >= 0
    assert sorted(runtime.destroyed) == list(range(1, 7))
    assert gpu._timed(lambda: None, 1, 0, 0.0)[0] == [0.0] and spins == [0.7]  # no spin asked: none


def fake_timed(monkeypatch, queued: list[float]):
    """gpu._timed that reports the next of `queued` host milliseconds; returns the spins asked."""
    attempts = []

    def timed(run, repeats, stream, spin_ms):
        attempts.append(spin_ms)
        return [float(len(attempts))] * repeats, queued.pop(0) if queued else 0.1

    monkeypatch.setattr(gpu, "_timed", timed)
    return attempts


def test_hidden_host_timing_with_a_pace_is_taken_again_when_queueing_outlasted_the_spin(monkeypatch):
    attempts = fake_timed(monkeypatch, [5.0])  # the first call loads code: 5 ms of host time
    pace = gpu.HostPace(0.05)
    assert gpu.time_calls(lambda: None, 1, 0, hide_host=pace) == [2.0]  # the second timing counts
    assert attempts == [pytest.approx(0.3), pytest.approx(0.2 + 2 * 5.0)]  # sized from what the first took
    assert pace.ms == 0.1
    attempts.clear()
    gpu.time_calls(lambda: None, 4, 0, hide_host=pace)
    assert attempts == [pytest.approx(0.2 + 2 * 4 * 0.1)]  # valid at once: one timing, no untimed call
    assert gpu.time_calls(lambda: None, 2, 0) == [2.0, 2.0] and attempts[-1] == 0.0  # host not hidden: no spin


def test_hidden_host_timing_without_a_pace_sizes_the_spin_from_one_untimed_call(monkeypatch):
    attempts = fake_timed(monkeypatch, [])
    ran = []
    monkeypatch.setattr(gpu.time, "perf_counter", iter([10.0, 10.004]).__next__)  # the call queues in 4 ms
    gpu.time_calls(lambda: ran.append(1), 3, 0, hide_host=True)
    assert ran == [1] and attempts == [pytest.approx(0.2 + 2 * 3 * 4.0)]


def test_a_timing_that_stays_host_bound_gives_up_after_three(monkeypatch):
    attempts = fake_timed(monkeypatch, [1e6] * 3)
    assert gpu.time_calls(lambda: None, 1, 0, hide_host=gpu.HostPace()) == [3.0]
    assert len(attempts) == 3 and attempts[-1] == gpu.SPIN_MAX_MS


class OneCandidate:
    """A backend with one candidate that takes `ms` per call, counting its calls."""

    name, blends = "engines", False

    def __init__(self, ms):
        self.ms, self.calls = ms, 0

    def candidates(self, problem):
        return [Candidate("engines:eng1", 0, OK)]

    def prepare(self, step):
        def call(*args):
            self.calls += 1
        return Plan(call, 0)

    def set_stream(self, stream):
        pass


@pytest.mark.parametrize("ms, timings", [(5.0, 1), (0.02, 2)])
def test_a_coarse_measurement_runs_a_slow_candidate_once_and_a_short_one_twice(monkeypatch, ms, timings):
    calls = []

    def time_calls(run, repeats, stream, hide_host=False):
        run()
        calls.append(hide_host)
        return [ms]

    monkeypatch.setattr(benchmark.gpu, "time_calls", time_calls)
    bench = object.__new__(benchmark.CudnnBenchmarker)
    bench.scratch, bench.stream, bench.pace = types.SimpleNamespace(workspace=lambda nbytes: 0), 0, gpu.HostPace()
    backend = OneCandidate(ms)
    bench.backends = Backends([backend])
    p = ConvProblem("F", (8, 4, 6, 6), (4, 4, 3, 3), pads=1)
    m, run = bench._coarse(p, p, backend.candidates(p)[0], dict(x=0, w=0, y=0), None)
    assert m == Measurement("engines:eng1", 8, ms, 0, OK, 1) and calls == [bench.pace] * timings
    assert backend.calls == timings  # no untimed warm-up call


def test_every_timing_preset_has_its_settings_in_one_table():
    from ucudnn.core.device import TIMING_PRESETS

    assert tuple(benchmark.TIMINGS) == TIMING_PRESETS  # best first, as the database ranks them
    assert all(settings.name == name for name, settings in benchmark.TIMINGS.items())
