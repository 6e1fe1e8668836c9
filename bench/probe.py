"""Quick look at one kernel: every algorithm at every power-of-two micro-batch, and how long
benchmarking it took. `python3 bench/probe.py` (AlexNet conv2 forward, B=256, fp32)."""
from __future__ import annotations

import time

from ucudnn.benchmark import CudnnBenchmarker
from ucudnn.config import batch_sizes
from ucudnn.problem import ConvKind, ConvProblem

if __name__ == "__main__":
    bench = CudnnBenchmarker()
    print(bench.device.describe())
    for kind in ConvKind:
        p = ConvProblem(kind, (256, 96, 27, 27), (256, 96, 5, 5), pads=2)
        start = time.perf_counter()
        results = bench.measure(p, batch_sizes("powerOfTwo", 256), cap=None)
        print(f"{kind}: {len(results)} measurements in {time.perf_counter() - start:.2f} s")
        for m in results:
            if m.batch in (1, 32, 256):
                t = f"{m.time_ms:8.3f} ms x{m.repeats}" if m.time_ms is not None else "       -"
                print(f"  b={m.batch:3d} {m.algo:22s} {m.status:13s} {t} ws={m.workspace / 2**20:9.2f} MiB")
