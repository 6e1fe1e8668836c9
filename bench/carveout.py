"""BF beside BD with each held to a share of the SMs (cuDNN's SM carveout), per ResNet-50 layer.

Overlapped, a layer's data and weight gradients each ran 19-54% longer than alone (docs/results.md,
"the concurrent backward, profiled"): both are tuned to fill the GPU. Here, for each distinct
convolution of ResNet-50 (the built-in table; fp16, channels-last, B = 32), the fastest BD and BF
plan of the graph API (the first TOP plans of heuristics A, B and FALLBACK, each timed) with
every SM, and with a target SM count (`KernelGraph(sm_count=...)`), are run as one pair:

- serial: BD, then BF, each with every SM (what a converted layer runs without concurrency);
- concurrent: BD and BF on two streams, each with every SM;
- carved a/b: BD on a SMs and BF on b = SMs - a, on two streams.

Pairs are timed as CUDA graphs of ten rounds each (a captured fork and join costs no host call),
replays timed with CUDA events after warm-up, medians. Each carved plan's result is checked
against the full plan's. Summed over the layers' calls: the speedup over serial of each way, and of
each layer the fastest way.

    PYTHONPATH=. python3 bench/carveout.py --out OUT [--batch 32] [--shares 44,66,88] [--bf-only 32]
        [--top 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SERIAL, CONCURRENT = "serial", "concurrent"


def ways(shares: list[int], sms: int, bf_only: list[int] = ()) -> list[tuple[str, int | None, int | None]]:
    """(name, BD's SM count, BF's; None: every SM): the serial and concurrent pairs with every
    SM, one carved pair per BD share (BF the rest), and one pair per BF share with BD on every SM."""
    return [(SERIAL, None, None), (CONCURRENT, None, None),
            *((f"carved {a}/{sms - a}", a, sms - a) for a in shares if 0 < a < sms),
            *((f"BF on {b}", None, b) for b in bf_only if 0 < b < sms)]


def summed(rows: list[dict]) -> dict:
    """Each way's milliseconds summed over the layers' calls, its speedup over serial, and the
    fastest way per layer."""
    names = list(rows[0]["ms"]) if rows else []
    total = {n: sum(r["count"] * r["ms"][n] for r in rows) for n in names}
    best = sum(r["count"] * min(r["ms"].values()) for r in rows)
    out = {"ms": total, "best_ms": best}
    if total.get(SERIAL):
        out["speedup"] = {n: total[SERIAL] / v for n, v in total.items()}
        out["best_speedup"] = total[SERIAL] / best
    return out


def markdown(rows: list[dict], total: dict) -> str:
    names = list(total["ms"])
    lines = ["| layer | calls | " + " | ".join(f"{n} (ms)" for n in names) + " | plans listed |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for r in rows:
        listed = ", ".join(f"{k} {v['listed']}" for k, v in r["plans"].items())
        lines.append(f"| {r['layer']} | {r['count']} | " + " | ".join(f"{r['ms'][n]:.3f}" for n in names)
                     + f" | {listed} |")
    speedups = ", ".join(f"{n} {s:.3f}x" for n, s in total.get("speedup", {}).items())
    lines += ["", f"Summed over calls: {speedups}; each layer its fastest way {total.get('best_speedup', 0):.3f}x"]
    return "\n".join(lines)


class Pairs:
    """BD and BF of layers on two streams, each on a frontend handle of its own."""

    def __init__(self, batch: int, top: int, cap: int):
        import torch

        from ucudnn.execute.backends import engines

        self.torch, self.engines, self.batch, self.top, self.cap = torch, engines, batch, top, cap
        self.fe = engines.frontend()
        self.streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        self.handles = [self.fe.create_handle() for _ in self.streams]
        for handle, stream in zip(self.handles, self.streams):
            self.fe.set_stream(handle=handle, stream=stream.cuda_stream)

    def operands(self, problem) -> dict:
        torch = self.torch
        make = lambda shape: torch.randn(shape, device="cuda", dtype=torch.float16).contiguous(  # noqa: E731
            memory_format=torch.channels_last)
        return {"x": make(problem.x_shape), "w": make(problem.w_shape), "y": make(problem.y_shape)}

    def fastest(self, problem, side: int, sm_count: int | None, data: dict):
        """(run, listed): the fastest of the first `top` plans within `cap` bytes, as a call on
        stream `side`; None where none builds."""
        graph = self.engines.KernelGraph(self.fe, problem, self.handles[side], sm_count)
        best = None
        for name in list(graph.index)[:self.top]:
            workspace = graph.build(name)
            if isinstance(workspace, str) or workspace > self.cap:
                continue
            scratch = self.torch.empty(max(workspace, 1), dtype=self.torch.uint8, device="cuda")
            pointers = {role: t.data_ptr() for role, t in data.items()}
            run = lambda g=graph, n=name, p=pointers, s=scratch: g.execute(n, p, s.data_ptr())  # noqa: E731
            ms = self.time([{side: [run]}])
            if best is None or ms < best[0]:
                best = (ms, run, name)
        return (None if best is None else best[1]), len(graph.index), (None if best is None else best[2])

    def time(self, stages: list[dict[int, list]], rounds: int = 10, replays: int = 15) -> float:
        """Milliseconds of one round, as the median of `replays` replays of one CUDA graph of
        `rounds` rounds: inside a graph, as in a converted model's captured step, a fork and join
        cost no host call. A round runs `stages` in turn, each forked from the first stream and
        joined into it; a stage's runs, by stream, side by side (each call runs on its handle's
        stream: BD's on the first, BF's on the second)."""
        from ucudnn.execute import gpu

        torch, s0 = self.torch, self.streams[0]
        self._round(stages)  # warm-up, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s0):
            for _ in range(rounds):
                self._round(stages)
        with torch.cuda.stream(s0):
            gpu.time_calls(graph.replay, 2, s0.cuda_stream)  # warm-up replays
            return statistics.median(gpu.time_calls(graph.replay, replays, s0.cuda_stream)) / rounds

    def _round(self, stages: list[dict[int, list]]) -> None:
        s0 = self.streams[0]
        for runs in stages:
            forked = s0.record_event()
            for side, calls in runs.items():
                stream = self.streams[side]
                stream.wait_event(forked)
                for call in calls:
                    call()
                if side:
                    s0.wait_stream(stream)

    def row(self, layer, shares: list[int], sms: int, bf_only: list[int]) -> dict:
        """The layer's pairs, each way; per plan, how many plans heuristics listed and the
        carved result's error relative to the full plan's."""
        from ucudnn.core.problem import ConvKind

        problem = layer.problem(ConvKind.FORWARD, self.batch, "float16", layout="nhwc")
        kinds = {"BD": (problem.with_kind(ConvKind.BACKWARD_DATA), 0),
                 "BF": (problem.with_kind(ConvKind.BACKWARD_FILTER), 1)}
        data = {kind: self.operands(p) for kind, (p, _) in kinds.items()}  # apart: BF writes dw, BD reads w
        plans, notes, reference = {}, {}, {}
        for _, a, b in ways(shares, sms, bf_only):
            for kind, target in (("BD", a), ("BF", b)):
                if (kind, target) in plans:
                    continue
                p, side = kinds[kind]
                run, listed, name = self.fastest(p, side, target, data[kind])
                plans[kind, target] = run
                notes[f"{kind} {target or sms}"] = {"listed": listed, "plan": name}
                if run is None:
                    continue
                run()
                self.torch.cuda.synchronize()
                out = data[kind][_OUT[kind]].float()
                if target is None:
                    reference[kind] = out.clone()
                else:
                    error = (out - reference[kind]).norm() / reference[kind].norm()
                    notes[f"{kind} {target}"]["error"] = error.item()
        ms = {}
        for name, a, b in ways(shares, sms, bf_only):
            first, second = plans["BD", a], plans["BF", b]
            if first is not None and second is not None:
                pair = [{0: [first]}, {1: [second]}] if name == SERIAL else [{0: [first], 1: [second]}]
                ms[name] = self.time(pair)
        return {"layer": layer.name, "problem": problem.describe(), "count": layer.count, "ms": ms, "plans": notes}


_OUT = {"BD": "x", "BF": "w"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--shares", default="44,66,88", help="BD's SM counts; BF gets the rest")
    parser.add_argument("--bf-only", default="", help="BF's SM counts beside BD on every SM")
    parser.add_argument("--top", type=int, default=5, help="plans timed per graph")
    parser.add_argument("--cap-mib", type=int, default=256, help="the most workspace a plan may take")
    parser.add_argument("--deadline", type=float, default=400)
    args = parser.parse_args(argv)
    import torch

    from ucudnn.core.nets import get_network

    began, out = time.monotonic(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shares, bf_only = ([int(s) for s in text.split(",") if s] for text in (args.shares, args.bf_only))
    layers = get_network("resnet50").layers[1:]  # the stem's input needs no gradient
    pairs, rows = Pairs(args.batch, args.top, args.cap_mib << 20), []
    for layer in layers:
        if time.monotonic() - began > args.deadline:
            print(f"deadline: {len(rows)} of {len(layers)} layers", file=sys.stderr)
            break
        try:
            rows.append(pairs.row(layer, shares, sms, bf_only))
        except Exception as exc:  # a layer that fails is a row saying why
            rows.append({"layer": layer.name, "count": layer.count, "error": f"{type(exc).__name__}: {exc}", "ms": {}})
        print(json.dumps(rows[-1]), flush=True)
        done = [r for r in rows if len(r["ms"]) == len(ways(shares, sms, bf_only))]  # every way timed
        total = summed(done)
        (out / "carveout.json").write_text(json.dumps({"sms": sms, "batch": args.batch, "rows": rows, "total": total},
                                                      indent=1))
        (out / "carveout.md").write_text(markdown(done, total) + "\n")
    print((out / "carveout.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
