"""Per kernel, torch's own cuDNN kernels beside ucudnn executed through ucudnn.Handle, in one run.

For every conv kernel (F, BD, BF) of a network at mini-batch B, on the same tensors and stream:
  torch      - torch.backends.cudnn.benchmark on, memory free: conv2d / aten.convolution_backward
  torch@L    - the same with only L bytes of GPU memory free beyond its tensors (--pressure): a
               blocker allocation, in a process of its own per L (torch caches its benchmark
               choice per shape), so torch's benchmark drops plans whose workspace does not fit
  unlimited  - ucudnn.Handle, backend all, policy undivided, no workspace limit: the fastest
               undivided candidate
  wr@L/B     - ucudnn.Handle, WR powerOfTwo, L bytes per kernel, backend B (one column per limit
               and backend of --backends; wr-all@L for the policy `all`, and so on)
Each is timed as a caller sees it: CUDA events around `--calls` calls back to back, median of
`--repeats` after warm-up (ucudnn's first call plans the kernel, benchmarking what the database
lacks). ucudnn's outputs are checked against torch's (relative error, reported per kernel).

    python3 bench/vs_torch.py --out OUT --net torchvision:alexnet --batch 256 --dtype float16 \
        --layout nhwc --limits 64MiB [--cache DB]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

torch.backends.cudnn.version()  # torch's libcudnn first, so ucudnn binds the same library

from ucudnn import Handle, format_size, parse_size  # noqa: E402
from ucudnn.execute import gpu
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.core.nets import get_network  # noqa: E402
from ucudnn.core.problem import ConvKind, ConvProblem  # noqa: E402

UNLIMITED = 1 << 40
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def operands(p: ConvProblem) -> dict[str, torch.Tensor]:
    """x, w, y of `p` as torch tensors in its layout, random (never zeros)."""
    fmt = torch.channels_last if p.layout == "nhwc" else torch.contiguous_format
    dtype = TORCH_DTYPES[p.dtype]
    return {role: torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            for role, shape in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape))}


def torch_call(p: ConvProblem, t: dict[str, torch.Tensor]):
    """torch's own kernel of `p`; returns the output it writes (y, dx or dw)."""
    args = (list(p.strides), list(p.pads), list(p.dilations), False, [0, 0], p.groups)
    if p.kind is ConvKind.FORWARD:
        return lambda: torch.ops.aten.convolution(t["x"], t["w"], None, *args)
    mask = [p.kind is ConvKind.BACKWARD_DATA, p.kind is ConvKind.BACKWARD_FILTER, False]
    index = 0 if p.kind is ConvKind.BACKWARD_DATA else 1
    return lambda: torch.ops.aten.convolution_backward(t["y"], t["x"], t["w"], None, *args, mask)[index]


def output_role(p: ConvProblem) -> str:
    return {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}[p.kind]


def median_ms(run, calls: int, repeats: int) -> float:
    """Milliseconds per call: `calls` back to back between two events, median of `repeats`."""
    stream = torch.cuda.current_stream().cuda_stream

    def many():
        for _ in range(calls):
            run()
    gpu.time_calls(many, 2, stream)
    return statistics.median(gpu.time_calls(many, repeats, stream)) / calls


def blocker_bytes(free: int, keep: int, margin: int = 3 * 2**20) -> int:
    """The allocation that leaves `keep` bytes free of `free` (less a margin for allocator slack)."""
    return max(free - keep - margin, 0)


def torch_under_pressure(kernels, keep: int, calls: int, repeats: int) -> dict[str, float | None]:
    """torch's time per kernel with only `keep` bytes free beyond the kernel's tensors (its output
    included, allocated once and cached by torch's allocator); None where torch failed."""
    times = {}
    for kernel in kernels:
        p = kernel.problem
        t = operands(p)
        room = torch.empty_like(t[output_role(p)])
        del room  # stays in torch's cache, so the output reuses it
        torch.cuda.synchronize()
        blocker = torch.empty(blocker_bytes(torch.cuda.mem_get_info()[0], keep), dtype=torch.uint8, device="cuda")
        try:
            times[kernel.name] = median_ms(torch_call(p, t), calls, repeats)
        except RuntimeError as exc:  # out of memory even for torch's smallest plan
            times[kernel.name] = None
            print(f"{kernel.name}: torch failed with {keep} bytes free: {exc}", flush=True)
        del blocker, t
        torch.cuda.empty_cache()
    return times


def pressure_columns(args) -> dict[str, dict[str, float | None]]:
    """torch@L for each L of --pressure, each measured by a fresh process of this script."""
    columns = {}
    for limit in filter(None, args.pressure.split(",")):
        command = [sys.executable, __file__, "--torch-only", limit, "--net", args.net, "--batch", str(args.batch),
                   "--dtype", args.dtype, "--layout", args.layout, "--calls", str(args.calls),
                   "--repeats", str(args.repeats)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        columns[f"torch@{format_size(parse_size(limit)).replace(' ', '')}"] = json.loads(result.stdout.splitlines()[-1])
    return columns


def compare(kernel, handles: dict[str, Handle], calls: int, repeats: int) -> dict:
    p = kernel.problem
    t = operands(p)
    reference = torch_call(p, t)
    row = dict(kernel=kernel.name, count=kernel.count, torch=median_ms(reference, calls, repeats))
    expected = reference().float()
    out = output_role(p)
    for name, handle in handles.items():
        ours = dict(t)
        ours[out] = torch.empty_like(t[out])

        def run(h=handle, o=ours):
            h.convolve(p, o["x"], o["w"], o["y"])
        ms = median_ms(run, calls, repeats)
        config = handle.configuration(p)
        error = (ours[out].float() - expected).norm() / expected.norm()
        row[name] = dict(measured=ms, predicted=config.time_ms, workspace=config.workspace,
                         config=config.describe(), rel_err_vs_torch=float(error))
    del t, ours, expected
    return row


def markdown(args, pressured: list[str], variants: list[str], rows: list[dict], device: str) -> str:
    lines = [f"### {args.net} B={args.batch} {args.dtype} {args.layout}, {device} (ms per kernel, "
             "ucudnn measured / predicted)", "",
             "| kernel | n | torch | " + " | ".join(pressured + variants) + " | "
             + " | ".join(f"{v}/torch" for v in variants) + " |",
             "|---|---|---|" + "---|" * (len(pressured) + 2 * len(variants))]
    ms = lambda v: "failed" if v is None else f"{v:.3f}"  # noqa: E731
    for r in rows:
        cells = [ms(r[v]) for v in pressured] + [f"{r[v]['measured']:.3f} / {r[v]['predicted']:.3f}" for v in variants]
        ratios = [f"{r[v]['measured'] / r['torch']:.2f}" for v in variants]
        lines.append(f"| {r['kernel']} | {r['count']} | {r['torch']:.3f} | " + " | ".join(cells + ratios) + " |")
    total = {v: sum(r["count"] * r[v]["measured"] for r in rows) for v in variants}
    total.update({v: sum(r["count"] * (r[v] if r[v] is not None else float("nan")) for r in rows) for v in pressured})
    total["torch"] = sum(r["count"] * r["torch"] for r in rows)
    lines.append(f"| total | | **{total['torch']:.2f}** | "
                 + " | ".join(f"**{total[v]:.2f}**" for v in pressured + variants)
                 + " | " + " | ".join(f"{total[v] / total['torch']:.2f}" for v in variants) + " |")
    worst = {v: max(r[v]["measured"] / r["torch"] for r in rows) for v in variants}
    lines += ["", "worst kernel over torch: " + ", ".join(f"{v} {w:.2f}x" for v, w in worst.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--net", default="torchvision:alexnet")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="float16")
    parser.add_argument("--layout", choices=("nchw", "nhwc"), default="nhwc")
    parser.add_argument("--limits", default="64MiB", help="WR limits per kernel, comma-separated")
    parser.add_argument("--policies", default="powerOfTwo", help="WR batch size policies, comma-separated")
    parser.add_argument("--cache", default=None, help="benchmark database (default OUT/vs_torch.db)")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backends", default="all,engines,legacy", help="ucudnn backends of the WR columns")
    parser.add_argument("--pressure", default="64MiB,8MiB", help="torch columns with only this much free")
    parser.add_argument("--torch-only", metavar="FREE", help=argparse.SUPPRESS)  # one pressure column
    args = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    kernels = get_network(args.net).problems(args.batch, args.dtype, layout=args.layout)
    if args.torch_only:
        print(json.dumps(torch_under_pressure(kernels, parse_size(args.torch_only), args.calls, args.repeats)))
        return 0
    start = time.perf_counter()
    pressure = pressure_columns(args)  # first: the fresh processes need the memory this one will take
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Cache(args.cache or out / "vs_torch.db")
    stream = torch.cuda.current_stream().cuda_stream
    handles = {"unlimited": Handle(cache=cache, stream=stream, policy="undivided",
                                   workspace_limit=UNLIMITED, backend="all")}
    for policy in args.policies.split(","):
        for limit in args.limits.split(","):
            for backend in args.backends.split(","):
                name = f"wr{'' if policy == 'powerOfTwo' else '-' + policy}@{format_size(parse_size(limit))}/{backend}"
                handles[name.replace(" ", "")] = Handle(cache=cache, stream=stream, policy=policy,
                                                        workspace_limit=limit, backend=backend)
    rows = []
    for kernel in kernels:
        rows.append(compare(kernel, handles, args.calls, args.repeats))
        rows[-1].update({column: times[kernel.name] for column, times in pressure.items()})
        print(json.dumps(rows[-1]), flush=True)
    device = gpu.device_info().for_execution(handles["unlimited"].settings.execution).describe()
    text = markdown(args, list(pressure), list(handles), rows, device)
    print(text)
    stem = f"vs_torch-{args.net.replace(':', '-')}-{args.batch}-{args.dtype}-{args.layout}"
    report = dict(device=device, torch=torch.__version__, date=time.strftime("%Y-%m-%d"), net=args.net,
                  batch=args.batch, dtype=args.dtype, layout=args.layout,
                  math=kernels[0].problem.math, seconds=round(time.perf_counter() - start, 1), rows=rows)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
