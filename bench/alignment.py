"""Does a micro-batch slice run slower when its pointers are less aligned than a fresh buffer?

Times single cuDNN calls on AlexNet kernels with x and y shifted by 0..256 bytes inside larger
buffers (cudaMalloc aligns to 256 bytes); the answer sets ucudnn.problem.SLICE_ALIGNMENT.
Also times one configuration through the benchmarker and through ConfigurationTimer in one
process, to check that the two agree.

    python3 bench/alignment.py --out OUT
"""
from __future__ import annotations

from probe_setup import median_ms, problem_of, start, write_report

from ucudnn import gpu
from ucudnn.benchmark import ConfigurationTimer, CudnnBenchmarker, TimingSettings
from ucudnn.bindings.convolution import convolve, workspace_size
from ucudnn.bindings.descriptors import KernelDescriptors
from ucudnn.bindings.enums import algo_count, algo_name
from ucudnn.optimizers.configuration import Configuration, MicroConfig

OFFSETS = (0, 4, 16, 32, 64, 128, 256)
# (layer/kind, micro-batch size, dtype, layout)
CASES = [("conv1/BD", 8, "float32", "nchw"), ("conv1/BF", 16, "float32", "nchw"),
         ("conv1/F", 16, "float32", "nchw"), ("conv2/F", 16, "float32", "nchw"),
         ("conv2/BF", 16, "float32", "nchw"), ("conv2/F", 16, "float16", "nhwc"),
         ("conv1/BD", 8, "float16", "nhwc")]


def time_at_offsets(handle, stream: int, problem, algo: int) -> dict:
    descs = KernelDescriptors(problem)
    try:
        ws = workspace_size(handle, problem.kind, descs, algo)
    except Exception as exc:  # unsupported here: nothing to time
        return {"error": str(exc)}
    pad = max(OFFSETS)
    arrays = {r: gpu.random_array((problem.sample_bytes(r) * problem.batch + pad,), "float16" if
                                  problem.itemsize == 2 else "float32", i) for i, r in enumerate("xy")}
    arrays["w"] = gpu.random_array(problem.w_shape, problem.dtype, 2)
    workspace = gpu.alloc(ws)
    times = {}
    for offset in OFFSETS:
        ptrs = {r: gpu.pointer(arrays[r]) + (offset if r != "w" else 0) for r in "xwy"}

        def run():
            convolve(handle, problem.kind, descs, ptrs, algo, workspace.ptr, ws, 1.0, 0.0, problem.dtype)

        times[offset] = median_ms(run, stream, 2, 10)
    return {"workspace": ws, "ms": times}


def main(argv=None) -> int:
    out, stream, handle = start(__doc__, argv)
    report = {"device": gpu.device_info().describe(), "offsets": list(OFFSETS), "cases": []}
    print(report["device"])
    print("kernel        b  dtype    algo                    " + "".join(f"{o:>9d}B" for o in OFFSETS))
    for name, b, dtype, layout in CASES:
        problem = problem_of("alexnet", 256, name, dtype, layout).with_batch(b)
        for algo in range(algo_count(problem.kind)):
            result = time_at_offsets(handle, stream, problem, algo)
            report["cases"].append(dict(kernel=name, batch=b, dtype=dtype, algo=algo, **result))
            if "ms" in result:
                print(f"{name:12s} {b:3d}  {dtype:8s} {algo_name(problem.kind, algo):22s} "
                      + "".join(f"{result['ms'][o]:10.3f}" for o in OFFSETS), flush=True)
    # benchmarker vs timer on the same configuration, in one process
    p = problem_of("alexnet", 256, "conv4/BD")
    bench = CudnnBenchmarker(timing=TimingSettings(min_repeats=10), execution="direct")
    timer = ConfigurationTimer(execution="direct")
    measured = {m.algo: m for m in bench.measure(p, [256], None) if m.available}
    for algo, m in measured.items():
        config = Configuration((MicroConfig(algo, 256, m.time_ms, m.workspace),))
        executed = [timer.time_ms(p, config) for _ in range(3)]
        report.setdefault("benchmark_vs_timer", []).append(dict(algo=algo, benchmark=m.time_ms, timer=executed))
        print(f"conv4/BD b=256 {algo_name(p.kind, algo):10s} benchmarker {m.time_ms:.3f} ms, executed "
              + ", ".join(f"{t:.3f}" for t in executed), flush=True)
    write_report(out, "alignment.json", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
