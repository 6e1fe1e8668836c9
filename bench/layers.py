"""Per-kernel comparison, measured by executing the dispatch on the GPU (issue: core slice).

For each network and workspace limit, every conv kernel (F, BD, BF) runs as:
  undivided  - cuDNN's own choice under the limit (WR with policy `undivided`: the baseline)
  wr_p2      - ucudnn WR, powerOfTwo micro-batches
  wr_all     - ucudnn WR, all micro-batch sizes
  unlimited  - the fastest undivided algorithm with no workspace limit
Each is executed as a ucudnn.Handle of the chosen execution runs it (graph: the calls replayed
as one CUDA graph; direct: one host call per micro-batch), timed with CUDA events as a caller sees
it (warm-up, median of repeats), and set beside its prediction from measurements timed for that
execution. Also: the `undivided` policy through ucudnn.Handle and the drop-in API vs cuDNN
called directly.

    python3 bench/layers.py --out OUT [--nets alexnet:256,resnet50:64] [--limits 8MiB,64MiB,512MiB]
                            [--execution graph|direct]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ucudnn import format_size, parse_size
from ucudnn.core.nets import get_network
from ucudnn.core.staging import slices_of
from ucudnn.measure.benchmark import ConfigurationTimer, CudnnBenchmarker, TimingSettings
from ucudnn.measure.cache import Cache
from ucudnn.optimizers.wr import optimize_wr
from ucudnn.plan.config import Settings, batch_sizes
from ucudnn.plan.sources import complete_tables

VARIANTS = {"undivided": "undivided", "wr_p2": "powerOfTwo", "wr_all": "all", "unlimited": "undivided"}


def measure_tables(kernels, limits, policies, bench, cache) -> dict:
    """Tables complete for every policy under the largest limit, and for B with no limit."""
    problems, tables = [k.problem for k in kernels], {}
    for policy in policies:
        start = time.perf_counter()
        tables = complete_tables(problems, Settings(policy=policy), max(limits), cache, bench)
        print(f"  benchmarked {policy}: {time.perf_counter() - start:.1f} s", flush=True)
    return tables


def compare(kernels, tables, limit, policies, timer, measured: dict) -> list[dict]:
    rows = []
    for k in kernels:
        p, table = k.problem, tables[k.problem.key]
        row = dict(kernel=k.name, count=k.count)
        for variant, policy in VARIANTS.items():
            if policy not in policies and variant.startswith("wr"):
                continue
            config = optimize_wr(table, p.batch, batch_sizes(policy, p.batch),
                                 None if variant == "unlimited" else limit, kernel=k.name,
                                 slices=slices_of(p))
            memo = (p.key, config)
            if memo not in measured:
                measured[memo] = timer.time_ms(p, config)
            row[variant] = dict(config=config.describe(),
                                predicted=config.time_ms, measured=measured[memo], workspace=config.workspace)
        rows.append(row)
    return rows


def handle_overhead(kernels, limit, cache, execution: str, repeats=20) -> dict:
    """Total time of every kernel through ucudnn.cudnn with a ucudnn.Handle (policy undivided)
    vs direct cuDNN calls with the algorithm that handle picked, back to back on one stream."""
    from ucudnn import Handle, cudnn
    from ucudnn.execute import gpu
    from ucudnn.execute.bindings import convolution
    from ucudnn.execute.bindings.descriptors import KernelDescriptors
    from ucudnn.measure.benchmark import Scratch

    handle = Handle(cache=cache, policy="undivided", workspace_limit=limit, execution=execution)
    plain = cudnn.create()
    cudnn.set_stream(plain, handle.stream)
    calls_direct, calls_handle, keep = [], [], []
    for k in kernels:
        p = k.problem
        scratch = Scratch()
        ptrs = scratch.operands(p)
        config = handle.configuration(p)
        ws = scratch.workspace(config.workspace)
        descs = KernelDescriptors(p)
        keep += [scratch, descs]
        algo = config.micro[0].algo
        calls_direct.append(lambda p=p, d=descs, r=ptrs, a=algo, w=ws, n=config.workspace:
                            convolution.convolve(plain, p.kind, d, r, a, w, n, 1.0, 0.0, p.dtype))
        api = {"F": cudnn.convolution_forward, "BD": cudnn.convolution_backward_data,
               "BF": cudnn.convolution_backward_filter}[p.kind.value]
        first, second, out = convolution.ROLES[p.kind]
        calls_handle.append(lambda api=api, d=descs, r=ptrs, f=first, s=second, o=out:
                            api(handle, 1.0, d[f], r[f], d[s], r[s], d.conv, 0, 0, 0, 0.0, d[o], r[o]))
    timing = TimingSettings(warmup=2, min_repeats=repeats, max_repeats=repeats)
    result = {}
    for name, calls in (("direct", calls_direct), ("handle", calls_handle)) * 2:  # interleaved twice
        times = gpu.time_calls(lambda: [c() for c in calls], timing.warmup, handle.stream)
        times = gpu.time_calls(lambda: [c() for c in calls], repeats, handle.stream)
        result.setdefault(name, []).append(sorted(times)[len(times) // 2])
    result = {name: min(v) for name, v in result.items()}
    result["overhead"] = result["handle"] / result["direct"] - 1
    return result


def totals(rows) -> dict:
    variants = [v for v in VARIANTS if v in rows[0]]
    return {v: {m: sum(r["count"] * r[v][m] for r in rows) for m in ("predicted", "measured")} for v in variants}


def markdown(net, batch, limit, rows, total) -> str:
    variants = [v for v in VARIANTS if v in rows[0]]
    lines = [f"### {net}, B={batch}, limit {format_size(limit)} (times in ms; measured / predicted)", "",
             "| kernel | n | " + " | ".join(variants) + " | WR p2 configuration |",
             "|---|---|" + "---|" * len(variants) + "---|"]
    for r in rows:
        cells = [f"{r[v]['measured']:.3f} / {r[v]['predicted']:.3f}" for v in variants]
        lines.append(f"| {r['kernel']} | {r['count']} | " + " | ".join(cells) + f" | {r['wr_p2']['config']} |")
    cells = [f"**{total[v]['measured']:.2f}** / {total[v]['predicted']:.2f}" for v in variants]
    lines.append("| total | | " + " | ".join(cells) + " | |")
    u = total["undivided"]["measured"]
    lines.append("")
    lines.append("speedup over undivided (measured): " + ", ".join(
        f"{v} {u / total[v]['measured']:.2f}x" for v in variants if v != "undivided"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--nets", default="alexnet:256,resnet50:64")
    parser.add_argument("--limits", default="8MiB,64MiB,512MiB")
    parser.add_argument("--policies", default="powerOfTwo,all")
    parser.add_argument("--cache", default=None, help="benchmark database (default OUT/layers.db)")
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16 (default float32)")
    parser.add_argument("--layout", default="nchw", help="nchw or nhwc (default nchw)")
    parser.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the undivided policy through the handle against cuDNN (AlexNet)")
    parser.add_argument("--execution", choices=("graph", "direct"), default="graph",
                        help="how kernels run, and so how their measurements are timed (default graph)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = [parse_size(v) for v in args.limits.split(",")]
    policies = args.policies.split(",")
    cache = Cache(args.cache or out / "layers.db")
    bench = CudnnBenchmarker(timing=TimingSettings(warmup=1, min_repeats=3, max_repeats=10, target_ms=10),
                             execution=args.execution)
    timer = ConfigurationTimer(timing=TimingSettings(warmup=2, min_repeats=10, max_repeats=10), execution=args.execution)
    report = {"device": bench.device.describe(), "execution": args.execution, "date": time.strftime("%Y-%m-%d"),
              "dtype": args.dtype, "layout": args.layout,
              "nets": []}
    text = [f"Device: {report['device']}; date {report['date']}\n"]
    for spec in args.nets.split(","):
        name, batch = spec.split(":")
        kernels = get_network(name).problems(int(batch), args.dtype, layout=args.layout)
        print(f"{name} B={batch}: {len(kernels)} kernels", flush=True)
        tables = measure_tables(kernels, limits, policies, bench, cache)
        measured: dict = {}
        for limit in limits:
            rows = compare(kernels, tables, limit, policies, timer, measured)
            total = totals(rows)
            report["nets"].append(dict(net=name, batch=int(batch), limit=limit, rows=rows, totals=total))
            text.append(markdown(name, batch, limit, rows, total))
            print(text[-1], flush=True)
        if name == "alexnet" and args.overhead:
            overhead = handle_overhead(kernels, 64 * 2**20, cache, args.execution)
            report["overhead"] = overhead
            text.append(f"undivided policy through the handle: {overhead['handle']:.3f} ms vs direct "
                        f"{overhead['direct']:.3f} ms for all {len(kernels)} kernels: "
                        f"overhead {100 * overhead['overhead']:.2f}%\n")
            print(text[-1], flush=True)
        variant = "" if (args.dtype, args.layout) == ("float32", "nchw") else f"-{args.dtype}-{args.layout}"
        stem = f"layers-{'-'.join(s.replace(':', '') for s in args.nets.split(','))}{variant}-{args.execution}"
        (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
        (out / f"{stem}.md").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
