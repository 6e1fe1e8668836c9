"""WD against WR at equal total workspace, measured by executing every kernel through a
ucudnn.Handle on the GPU (the paper's Fig. 13/14 setting: AlexNet, B=256, fp32).

For each per-kernel limit L: WR gives every kernel L bytes; WD divides L x kernels among them.
Beside them: cuDNN undivided at L (policy `undivided`) and the unlimited-workspace best.

    python3 bench/wd_gpu.py --out OUT [--net alexnet:256] [--limits 1MiB,8MiB,64MiB] [--cache DB]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ucudnn import Handle, format_size, parse_size
from ucudnn.execute import gpu
from ucudnn.measure.benchmark import Scratch
from ucudnn.measure.cache import Cache, recorded_path
from ucudnn.core.nets import get_network

REPEATS, WARMUP = 10, 2
UNLIMITED = 64 * 2**30


def variants(limit: int, kernels: int) -> dict[str, dict]:
    """Handle settings of each variant at per-kernel limit `limit`."""
    return {
        "undivided": dict(optimizer="wr", policy="undivided", workspace_limit=limit),
        "wr": dict(optimizer="wr", policy="powerOfTwo", workspace_limit=limit),
        "wd": dict(optimizer="wd", policy="powerOfTwo", total_limit=limit * kernels),
        "unlimited": dict(optimizer="wr", policy="undivided", workspace_limit=UNLIMITED),
    }


def median_ms(run, stream: int) -> float:
    gpu.time_calls(run, WARMUP, stream)
    return statistics.median(gpu.time_calls(run, REPEATS, stream))


def measure(kernels, operands: dict, cache: Cache, settings: dict) -> dict:
    """Plan every kernel (WD: as one network) and time each, and the whole pass, by executing it."""
    with Handle(cache=cache, **settings) as handle:
        with handle.network():
            for k in kernels:
                handle.query(k.problem)
        calls = {k.name: (lambda p=k.problem, o=operands[k.name]: handle.convolve(p, *o)) for k in kernels}
        per_kernel = {name: median_ms(call, handle.stream) for name, call in calls.items()}
        whole = median_ms(lambda: [call() for call in calls.values()], handle.stream)
        plans = {k.name: handle.assignment(k.problem) for k in kernels}
        wd = handle.wd_result
        return dict(
            measured_ms=whole, measured_sum_ms=sum(per_kernel.values()),
            predicted_ms=sum(p.configuration.time_ms for p in plans.values()),
            workspace=wd.total_workspace if wd else sum(p.workspace_size for p in plans.values()),
            solver=dict(variables=wd.variables, build_s=wd.build_seconds, solve_s=wd.solve_seconds) if wd else None,
            kernels={name: dict(measured_ms=per_kernel[name], predicted_ms=p.configuration.time_ms,
                                workspace=p.workspace_size,
                                config=p.configuration.describe())
                     for name, p in plans.items()},
        )


def _kind(kernel_name: str) -> str:
    return kernel_name.rsplit("/", 1)[1]


def breakdown(kernels, result: dict) -> str:
    """The paper's Fig. 14 as a table: what each kernel got and how long it took."""
    total = max(result["workspace"], 1)
    lines = ["| kernel | configuration | workspace MiB | share % | measured ms |", "|---|---|---|---|---|"]
    for k in kernels:
        r = result["kernels"][k.name]
        lines.append(f"| {k.name} | {r['config']} | {r['workspace'] / 2**20:.2f} | "
                     f"{100 * r['workspace'] / total:.1f} | {r['measured_ms']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--net", default="alexnet:256")
    parser.add_argument("--limits", default="1MiB,8MiB,64MiB", help="per-kernel limits L (WD gets L x kernels)")
    parser.add_argument("--cache", help="benchmark database (default: the shipped recording)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name, batch = args.net.split(":")
    kernels = get_network(name).problems(int(batch))
    cache = Cache(args.cache or recorded_path())
    scratch = {k.name: Scratch() for k in kernels}
    operands = {k.name: [scratch[k.name].operands(k.problem)[r] for r in "xwy"] for k in kernels}
    report = dict(device=gpu.device_info().describe(), date=time.strftime("%Y-%m-%d"), net=args.net, rows=[])
    lines = [f"WD vs WR, {name} B={batch}, fp32, measured by executing the handle's dispatch on "
             f"{report['device']}, {report['date']}", "",
             "| per-kernel L | total | undivided ms | WR ms | WD ms | unlimited ms | WR/WD | WD/unlimited | WD variables |",
             "|---|---|---|---|---|---|---|---|---|"]
    for limit in map(parse_size, args.limits.split(",")):
        row = {v: measure(kernels, operands, cache, s) for v, s in variants(limit, len(kernels)).items()}
        row["limit"] = limit
        report["rows"].append(row)
        ms = {v: row[v]["measured_ms"] for v in ("undivided", "wr", "wd", "unlimited")}
        lines.append(f"| {format_size(limit)} | {format_size(limit * len(kernels))} | {ms['undivided']:.2f} | "
                     f"{ms['wr']:.2f} | {ms['wd']:.2f} | {ms['unlimited']:.2f} | {ms['wr'] / ms['wd']:.2f} | "
                     f"{ms['wd'] / ms['unlimited']:.2f} | {row['wd']['solver']['variables']} |")
        print(lines[-1], flush=True)
    for row in report["rows"]:
        lines += ["", f"WD division at {format_size(row['wd']['workspace'])} "
                      f"(limit {format_size(row['limit'] * len(kernels))}):", "", breakdown(kernels, row["wd"])]
    (out / "wd_gpu.json").write_text(json.dumps(report, indent=1))
    (out / "wd_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4 + len(report["rows"]):]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
