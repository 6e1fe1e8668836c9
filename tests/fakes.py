"""Stand-ins for the GPU in CPU tests: a benchmarker with a synthetic cost model and an allocator."""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

from ucudnn.core.accumulation import accumulates
from ucudnn.core.device import Provenance
from ucudnn.core.errors import NoAlgorithmError
from ucudnn.core.measurements import OK, OVER_CAP, PRUNED, UNSUPPORTED, Measurement
from ucudnn.execute.backends import Backends, Candidate, backend_of
from ucudnn.measure.benchmark import timing_step
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.plan.assignment import Assignment

FAKE_DEVICE = Provenance("Fake GPU", "0.0", 91900, 0, "testhost", execution="graph")

# algorithm -> (ms per sample, fixed ms, workspace bytes per sample): fast ones need workspace
ALGORITHMS = {"legacy:A0": (0.050, 0.01, 0), "legacy:A1": (0.020, 0.02, 64 * 2**10),
              "legacy:A2": (0.008, 0.05, 1 * 2**20)}
# the engine backend's candidates, as FakeBenchmarker(backends=(..., "engines")) measures them; None: unsupported
ENGINE_ALGORITHMS = {"engines:E0": (0.030, 0.015, 0), "engines:E1": (0.006, 0.04, 2 * 2**20), "engines:E2": None}
CANDIDATES = {"legacy": ALGORITHMS, "engines": ENGINE_ALGORITHMS}
BLENDS = {"legacy": True, "engines": False}  # whose calls take alpha and beta (ucudnn.core.accumulation)


class FakeBenchmarker:
    """t(a, b) = work * (per_sample * b + fixed); ws(a, b) = ws_per_sample * b * work, where work
    is the kernel's per-sample size, plus the buffers of a part of a backward-filter sum, which
    it records as such (ucudnn.core.accumulation), as CudnnBenchmarker does. Counts measurements.
    Measures the candidates of `backend` (None: of each of its `backends`, CANDIDATES), ranked in
    CANDIDATES' order: with `best`, the first `best` at each size (on to the first that fits the
    cap where none of them does), the rest recorded PRUNED, and so those in `skip`; a backend it was not made with is refused (ConfigError), as CudnnBenchmarker
    refuses it."""

    def __init__(self, device: Provenance = FAKE_DEVICE, scale: float = 1.0, backends=("legacy",)):
        self.device, self.scale, self.calls = device, scale, 0
        self.backends = Backends([FakeBackend(name) for name in backends])

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        names = [self.backends[backend].name] if backend else self.backends.names
        candidates = {algo: model for name in names for algo, model in CANDIDATES[name].items()}
        results = []
        work = problem.flops() / problem.batch / 1e6  # per-sample size of the kernel
        seen, timed = Counter(), Counter()
        for b, (algo, model) in itertools.product(sorted(set(sizes)), candidates.items()):
            summed = accumulates(problem, b)
            seen[b, backend_of(algo)] += 1
            if (best is not None and seen[b, backend_of(algo)] > best and timed[b, backend_of(algo)]) or algo in skip:
                results.append(Measurement(algo, b, None, 0, PRUNED, accumulates=summed))
                continue
            self.calls += 1
            if model is None:
                results.append(Measurement(algo, b, None, 0, UNSUPPORTED, accumulates=summed))
                continue
            per, fixed, ws_per = model
            buffers = timing_step(problem, b, algo, lambda a: BLENDS[backend_of(a)]).route.buffer_bytes
            ws = int(ws_per * b * max(work, 1e-3)) + buffers
            if cap is not None and ws > cap:
                results.append(Measurement(algo, b, None, ws, OVER_CAP, accumulates=summed))
            else:
                timed[b, backend_of(algo)] += 1
                results.append(Measurement(algo, b, self.scale * work * (per * b + fixed), ws, OK, 3, summed))
        return results


def slower(monkeypatch, kind, factor: float) -> None:
    """FakeBenchmarker's candidates of `kind` `factor` times slower than its model says (a BD
    with no fast plan within the limit, as docs/results-archive.md's "Like for like" found one)."""
    measure = FakeBenchmarker.measure

    def slowed(self, problem, *args, **kwargs):
        results = measure(self, problem, *args, **kwargs)
        if problem.kind is not kind:
            return results
        return [m if m.time_ms is None else dataclasses.replace(m, time_ms=m.time_ms * factor) for m in results]
    monkeypatch.setattr(FakeBenchmarker, "measure", slowed)


def ranked(problem) -> list[Candidate]:
    """The legacy candidates as the fakes rank them, as cuDNN's heuristic would: fastest first at
    the whole batch, each with its workspace there."""
    work, b = problem.flops() / problem.batch / 1e6, problem.batch
    return [Candidate(algo, int(ALGORITHMS[algo][2] * b * max(work, 1e-3)), OK)
            for algo in sorted(ALGORITHMS, key=lambda a: ALGORITHMS[a][0] * b + ALGORITHMS[a][1])]


def favourite(problem) -> Candidate:
    """cuDNN's favourite as the fakes rate it: the first ranked."""
    return ranked(problem)[0]


def heuristic(problem, limit: int):
    """Handle.heuristic as the fakes rate it: the first ranked candidate whose workspace fits
    `limit`, undivided; NoAlgorithmError where none does."""
    fits = next((c for c in ranked(problem) if c.workspace <= limit), None)
    if fits is None:
        raise NoAlgorithmError(f"no fake candidate within {limit} bytes")
    return Assignment(Configuration((MicroConfig(fits.id, problem.batch, math.nan, fits.workspace),)), 0, fits.workspace)


def favourite_ms(problem) -> float:
    """The fakes' time of their favourite (favourite()) on the whole batch."""
    work = problem.flops() / problem.batch / 1e6
    per, fixed, _ = ALGORITHMS[favourite(problem).id]
    return work * (per * problem.batch + fixed)


class FakeBackend:
    """A backend by name only, for code that asks which backends are in use."""

    def __init__(self, name: str):
        self.name, self.blends = name, BLENDS.get(name, True)

    def set_stream(self, stream: int) -> None:
        pass

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeAllocator:
    """Hands out increasing fake addresses and remembers the sizes asked for."""

    def __init__(self):
        self.sizes: list[int] = []
        self._next = 1 << 20

    def __call__(self, nbytes: int) -> int:
        self.sizes.append(nbytes)
        address, self._next = self._next, self._next + nbytes + 4096
        return address


def damage_middle(path, seed: int = 16) -> None:
    """Overwrite the page in the middle of an SQLite file with random bytes (fixed seed), as a
    disk or copy error would: the file still opens, its header is intact."""
    import random

    data = bytearray(open(path, "rb").read())
    page_size = int.from_bytes(data[16:18], "big")
    middle = len(data) // page_size // 2 * page_size
    data[middle:middle + page_size] = random.Random(seed).randbytes(page_size)
    open(path, "wb").write(bytes(data))


def overwrite_root(path, table: str, source: str) -> None:
    """Overwrite the root page of `table` in an SQLite file with a copy of the root page of
    `source`, as a copy or a disk that puts a page in the wrong place leaves it: the file opens and
    reads, and SQLite's checks report a problem per child page the two roots share (up to 100)."""
    import sqlite3
    from pathlib import Path

    with sqlite3.connect(path) as conn:
        roots = dict(conn.execute("SELECT name, rootpage FROM sqlite_master"))
    conn.close()
    data = bytearray(Path(path).read_bytes())
    size = int.from_bytes(data[16:18], "big")

    def page(name: str) -> slice:
        return slice((roots[name] - 1) * size, roots[name] * size)
    data[page(table)] = data[page(source)]
    Path(path).write_bytes(bytes(data))


def spoil(path, *statements: str) -> None:
    """Change a database as another program could: run SQL `statements` on it."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


# Files ucudnn did not make: an empty one, and SQLite databases of another program
FOREIGN_TABLES = {
    "empty": [],
    "people": ["CREATE TABLE people (name TEXT, age INTEGER)", "INSERT INTO people VALUES ('Ada', 36)"],
    "measurements": ["CREATE TABLE measurements (id INTEGER PRIMARY KEY, reading REAL)",
                     "INSERT INTO measurements VALUES (1, 20.5)"],
    "empty measurements": ["CREATE TABLE measurements (id INTEGER PRIMARY KEY, reading REAL)"],
}


def make_foreign(path, kind: str):
    """A file ucudnn did not make at `path`, of a kind of FOREIGN_TABLES; returns `path`."""
    open(path, "wb").close()
    spoil(path, *FOREIGN_TABLES[kind])
    return path


def checksums(*paths) -> dict:
    """The SHA-256 of each file and of its journal (None where there is none): the same before
    and after means nothing was changed."""
    import hashlib
    from pathlib import Path

    every = [q for p in map(Path, paths) for q in (p, p.with_name(p.name + "-journal"))]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None for p in every}
