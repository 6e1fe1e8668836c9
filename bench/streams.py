"""Independent work on several streams, measured side by side in one process (the concurrency
issue's bars):

(a) inference, fp16: torchvision GoogLeNet and Inception-v3 (the bars) and ResNet-50 and AlexNet
    (no slower), each captured as one CUDA graph run on one stream (torch's own model) and as one
    graph of the same model on STREAMS streams (ucudnn.integrations.torch.streams.Streamed: its
    nodes timed with CUDA events, scheduled by the critical path); graph replays timed with CUDA
    events taking turns, medians; outputs compared. Bars: >= 1.5x at B = 1 and >= 1.2x at B = 32
    for GoogLeNet and Inception-v3; no model slower than its one-stream graph beyond 2%. The
    streams graph is Streamed's default (the stream that runs most of the critical path at a high
    priority); beside it, the same schedule with every stream at one priority, in turns.
(b) the concurrent backward: ResNet-50 AMP channels_last B = 32 training steps with every layer
    through ucudnn (delegation off, 64 MiB), BF beside BD (concurrent_backward) against
    the same copy without, and a second serial copy (the A/A control), taking turns (train_ab's
    interleave), medians. Bar: >= 1.05x.

    PYTHONPATH=. python3 bench/streams.py --out OUT [--models googlenet,inception_v3,resnet50,alexnet]
        [--batches 1,8,32] [--streams 4] [--no-backward]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from bench.common import alternate_rounds, median_iteration_ms, relative_error

BARS = {1: 1.5, 32: 1.2}  # batch -> the least speedup of a graph on several streams (GoogLeNet, Inception-v3)
BARRED = ("googlenet", "inception_v3")
TRAINING_BAR = 1.25  # GoogLeNet's graphed fp16 training step at B = 32
NO_SLOWER = 0.98  # every other model and batch: at least this
BACKWARD_BAR = 1.05


def verdicts(row: dict) -> dict:
    """A row's bar: the speedup's floor for its model and batch, and whether it holds."""
    speedup = row["one_stream_ms"] / row["streams_ms"]
    if row.get("step") == "training":
        floor = TRAINING_BAR if row["model"] == "googlenet" and row["batch"] == 32 else NO_SLOWER
    else:
        floor = BARS.get(row["batch"], NO_SLOWER) if row["model"] in BARRED else NO_SLOWER
    return {"speedup": speedup, "floor": floor, "ok": speedup >= floor}


def markdown(rows: list[dict], backward: dict | None) -> str:
    lines = ["| model | batch | one stream, graph (ms) | streams, graph (ms) | predicted (ms) | speedup | bar | "
             "equal priorities (ms) | ceiling: N copies side by side | difference from one stream |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['error']} | | | | | | | |")
            continue
        v = r["verdicts"]
        equal = (f"{r['equal_priority_ms']:.3f} ({r['one_stream_ms'] / r['equal_priority_ms']:.2f}x)"
                 if "equal_priority_ms" in r else "-")
        lines.append(f"| {r['model']}{' training' if r.get('step') == 'training' else ''} | {r['batch']} | {r['one_stream_ms']:.3f} | {r['streams_ms']:.3f} | "
                     f"{r['predicted_ms']:.3f} | {v['speedup']:.2f}x | >= {v['floor']:.2f}: "
                     f"{'met' if v['ok'] else 'NOT met'} | {equal} | {ceiling(r)} | {difference(r)} |")
    lines += [f"\n{r['model']} training B={r['batch']}, converted with BF beside BD in every layer's backward "
              f"({r['delegated_kernels']} of {r['kernels']} kernels delegated to torch): one stream "
              f"{r['bf_beside_bd_ms']:.3f} ms ({r['one_stream_ms'] / r['bf_beside_bd_ms']:.3f}x), "
              f"{r['used_streams']} streams {r['streams_bf_beside_bd_ms']:.3f} ms "
              f"({r['one_stream_ms'] / r['streams_bf_beside_bd_ms']:.3f}x)" for r in rows if "bf_beside_bd_ms" in r]
    if backward:
        lines += ["", f"Concurrent backward, ResNet-50 AMP B=32 through ucudnn: serial {backward['serial_ms']:.2f} ms, "
                  f"concurrent {backward['concurrent_ms']:.2f} ms ({backward['speedup']:.3f}x, bar {BACKWARD_BAR}x: "
                  f"{'met' if backward['speedup'] >= BACKWARD_BAR else 'NOT met'}); A/A {backward['control']:.3f}",
                  "", f"The same as one CUDA graph (forward and backward, no optimizer): serial "
                  f"{backward['graph_serial_ms']:.2f} ms, concurrent {backward['graph_concurrent_ms']:.2f} ms "
                  f"({backward['graph_speedup']:.3f}x, bar {BACKWARD_BAR}x: "
                  f"{'met' if backward['graph_speedup'] >= BACKWARD_BAR else 'NOT met'}); A/A {backward['graph_control']:.3f}"]
        if "graph_serial_delegated_ms" in backward:
            lines += ["", f"With delegation on ({backward.get('delegated_kernels', '?')} of {backward.get('kernels', '?')} "
                      "kernels left to torch's kernels, BF beside BD there too): " + "; ".join(
                          f"{way} serial {backward[f'{way}_serial_delegated_ms']:.2f} ms, concurrent "
                          f"{backward[f'{way}_concurrent_delegated_ms']:.2f} ms "
                          f"({backward[f'{way}_serial_delegated_ms'] / backward[f'{way}_concurrent_delegated_ms']:.3f}x)"
                          for way in ("eager", "graph"))]
    return "\n".join(lines) + "\n"


def difference(row: dict) -> str:
    """The row's worst relative difference from the one-stream run: outputs (inference) or the
    weights' gradients (training), '-' where none was taken."""
    value = row.get("grad_difference", row.get("output_difference"))
    if value is None:
        return "-"
    if "grad_difference" not in row:
        return f"outputs {value:.1e}"
    control = row.get("grad_differences", {}).get("control")
    return f"gradients {value:.1e}" + ("" if control is None else f" (A/A {control:.1e})")


def ceiling(row: dict) -> str:
    """'2: 1.31x, 4: 1.35x': each count of independent copies run side by side, and how much
    faster than one after another (side_by_side); '-' where none was run."""
    return ", ".join(f"{n}: {c:.2f}x" for n, c in row.get("ceiling", {}).items()) or "-"


def graphed(run, example):
    """`run` captured on a static copy of `example` as one CUDA graph: (replay, static output).
    The copy is a leaf of its own (a clone's backward would run on the stream the clone ran on,
    outside the capture); replay keeps it and `run` alive."""
    import torch

    static = example.detach().clone().requires_grad_(example.requires_grad)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static)

    def replay(static=static, run=run):  # holds what the graph reads and writes: the copy and its
        graph.replay()                     # gradient, and what `run` holds (a module, its gradients)
    return replay, out


def replay_ms(replays: dict, rounds: int = 7, repeats: int = 20) -> dict[str, float]:
    """Median ms of one replay of each graph, the graphs taking turns round by round
    (common.alternate_rounds, timed by CUDA events)."""
    import torch

    from ucudnn.execute import gpu

    stream = torch.cuda.current_stream().cuda_stream
    times = alternate_rounds(replays, lambda loop: gpu.time_calls(loop, 1, stream)[0], rounds, repeats)
    return {name: statistics.median(t) for name, t in times.items()}


def half_model(name: str, batch: int):
    """torchvision's `name` in fp16 on the GPU (seeded), and an fp16 input of `batch` for it; no
    dropout (its masks differ from run to run, and the runs' results are compared), and batch
    norms whose running statistics are the input's (a fresh model's, mean 0 and variance 1, let
    Inception-v3's activations grow past fp16's range in eval mode: its outputs were NaN)."""
    import torch
    import torchvision

    size = 299 if name == "inception_v3" else 224
    options = {"aux_logits": False, "init_weights": True} if name in BARRED else {}
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **options).cuda().half()
    x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.float16)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, that pass's statistics
    with torch.no_grad():
        model(x)
    for norm in norms:
        norm.momentum = 0.1
    return model, x


def gradient_difference(module, reference) -> float:
    """The weight gradients of `module` against `reference`'s, all of them as one vector
    (relative_error): a parameter whose gradient nearly cancels weighs what it holds."""
    import torch

    pairs = [(a.grad, b.grad) for a, b in zip(module.parameters(), reference.parameters()) if b.grad is not None]
    return relative_error(torch.cat([a.flatten() for a, _ in pairs]), torch.cat([b.flatten() for _, b in pairs]))


def side_by_side(runs: list, example):
    """The runs, each on a copy of `example` and a stream of its own, forked and joined, captured
    as one CUDA graph (graphed): N independent copies of the model on N streams give concurrency
    every chance to overlap at these kernels' shapes, so N times one copy's time over theirs
    bounds what one copy's branches on N streams can gain (`ceiling`; a bound for as many copies
    as streams only: four streams may beat two copies)."""
    from ucudnn.integrations.torch.streams import CudaStreams

    streams = CudaStreams(len(runs))
    statics = [example.detach().clone() for _ in runs]

    def together(_):
        streams.fork()
        for index, (run, static) in enumerate(zip(runs, statics)):
            with streams.on(index):
                run(static)
        streams.join()
    return graphed(together, example)[0]


def timed_row(row: dict, one, many, plan, equal, copies: dict | None = None, more: dict | None = None) -> dict:
    """`row` with the one-stream, streams (Streamed's default: the critical path's stream first)
    and equal-priority replays timed (taking turns), the schedule's figures and its verdicts (on
    the default); `copies` (count -> replay of side_by_side), each copies' ceiling beside them;
    `more` (key -> replay), timed in the same turns."""
    copies = copies or {}
    replays = {"one_stream_ms": one, "streams_ms": many, "equal_priority_ms": equal,
               **{f"copies_{n}_ms": replay for n, replay in copies.items()}, **(more or {})}
    row.update(replay_ms(replays), predicted_ms=plan.makespan_ms, critical_ms=plan.critical_ms,
               nodes=len(plan.placements), used_streams=plan.streams)
    row["ceiling"] = {n: n * row["one_stream_ms"] / row[f"copies_{n}_ms"] for n in copies}
    row["verdicts"] = verdicts(row)
    return row


def inference_row(name: str, batch: int, streams: int, copies: tuple[int, ...] = ()) -> dict:
    import torch

    from ucudnn.integrations.torch.streams import Streamed

    model, x = half_model(name, batch)
    model.eval()
    row = {"model": name, "batch": batch, "streams": streams}
    with torch.no_grad():
        streamed = Streamed(model, x, streams=streams)
        level = Streamed(model, x, streams=streams, times=streamed.times, critical_first=False)
        one, want = graphed(model, x)
        many, got = graphed(streamed, x)
        equal, got_equal = graphed(level, x)
        together = {n: side_by_side([model] * n, x) for n in copies}
        one(), many(), equal()
        torch.cuda.synchronize()
        row["output_difference"] = max(relative_error(g, want) for g in (got, got_equal))
        return timed_row(row, one, many, streamed.plan, equal, together)


def training_row(name: str, batch: int, streams: int, copies: tuple[int, ...] = ()) -> dict:
    """One fp16 training step (half weights; forward and backward, no optimizer) of the model
    captured as one CUDA graph, on one stream and on `streams` streams: autograd runs each node's
    backward on the stream its forward ran on, so the backward branches run concurrently too.
    Beside them, the model converted (delegation on: layers ucudnn would not speed up run torch's
    own convolution) with BF beside BD in every layer's backward (concurrent_backward), on one
    stream (`bf_beside_bd_ms`) and on the same streams (`streams_bf_beside_bd_ms`). Each copy's
    weight gradients against the one-stream model's (`grad_differences`), beside a second
    one-stream copy's (`control`: 0 where the one-stream graph is deterministic, so that what the
    others differ by is theirs)."""
    import torch

    from ucudnn.integrations.torch.streams import Streamed

    model, x = half_model(name, batch)
    dy = torch.randn(batch, 1000, device="cuda", dtype=torch.float16) / batch  # as a mean loss's gradient
    twin, level_twin, control = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    converted = [converted_beside(copy.deepcopy(model)) for _ in range(2)]  # as `model`: no gradients yet
    with torch.no_grad():
        streamed = Streamed(twin, x, streams=streams)
        level = Streamed(level_twin, x, streams=streams, times=streamed.times, critical_first=False)

    def step(module):
        def run(static):
            out = module(static)
            out.backward(dy)
            return out
        return run
    row = {"model": name, "batch": batch, "streams": streams, "step": "training"}
    one, _ = graphed(step(model), x)
    again, _ = graphed(step(control), x)
    many, _ = graphed(step(streamed), x)
    equal, _ = graphed(step(level), x)
    together = {n: side_by_side([step(copy.deepcopy(model)) for _ in range(n)], x) for n in copies}
    with torch.no_grad():
        split = Streamed(converted[1], x, streams=streams, times=streamed.times)
    beside = {"bf_beside_bd_ms": graphed(step(converted[0]), x)[0],
              "streams_bf_beside_bd_ms": graphed(step(split), x)[0]}
    for replay in (one, again, many, equal, *beside.values()):
        replay()
    torch.cuda.synchronize()
    variants = {"control": control, "streams": twin, "equal_priorities": level_twin, "bf_beside_bd": converted[0],
                "streams_bf_beside_bd": converted[1]}
    row["grad_differences"] = {k: gradient_difference(m, model) for k, m in variants.items()}
    row["grad_difference"] = max(v for k, v in row["grad_differences"].items() if k != "control")
    row = timed_row(row, one, many, streamed.plan, equal, together, beside)
    row["delegated_kernels"], row["kernels"] = delegated_kernels(converted[1])
    return row


def converted_beside(model):
    """`model` converted with BF beside BD in every layer's backward, delegation on (256 MiB)."""
    import ucudnn.torch as ut
    from ucudnn.plan.config import Settings

    settings = Settings.load(workspace_limit="256MiB", planning="first_call")
    return ut.convert(model, context=ut.Context(settings, concurrent_backward=True))


def delegated_kernels(model) -> tuple[int, int]:
    """(kernels left to torch, kernels) of a converted model."""
    import ucudnn.torch as ut

    kernels = ut.context_of(model).summary()["kernels"]
    return sum(k["delegated"] for k in kernels), len(kernels)


def backward_variants(module, delegated: bool = False):
    """(name, copy) of `module` with every layer through ucudnn (64 MiB per kernel, delegation
    off): serial, with BF beside BD, and a second serial copy (the A/A control); with `delegated`,
    also serial and with BF beside BD with delegation on (`serial_delegated`, `concurrent_delegated`:
    the layers ucudnn would not speed up run torch's own kernels, BF beside BD all the same)."""
    import ucudnn.torch as ut
    from ucudnn.plan.config import Settings

    variants = [("serial", False, False), ("concurrent", True, False), ("control", False, False)]
    variants += [("serial_delegated", False, True), ("concurrent_delegated", True, True)] if delegated else []
    for name, concurrent, delegate in variants:
        settings = Settings.load(workspace_limit="64MiB", planning="first_call")
        yield name, ut.convert(copy.deepcopy(module),
                               context=ut.Context(settings, delegate=delegate, concurrent_backward=concurrent))


def backward_row(rounds: int = 5, iters: int = 10) -> dict:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(32, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (32,), device="cuda")
    steps, replays, delegated = {}, {}, (0, 0)
    for name, copy_ in backward_variants(model, delegated=True):
        optimizer = torch.optim.SGD(copy_.parameters(), lr=1e-3)

        def step(m=copy_, o=optimizer):
            o.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(m(x), target)
            loss.backward()
            o.step()
        for _ in range(2):
            step()
        steps[name] = step

        def forward_backward(static, m=copy_):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(m(static), target)
            loss.backward()
            return loss
        replays[name] = graphed(forward_backward, x)[0]
        if name == "concurrent_delegated":
            delegated = delegated_kernels(copy_)
    ms = median_iteration_ms(steps, rounds, iters)
    graph_ms = replay_ms(replays)
    return {"serial_ms": ms["serial"], "concurrent_ms": ms["concurrent"], "control_ms": ms["control"],
            "speedup": ms["serial"] / ms["concurrent"], "control": ms["serial"] / ms["control"],
            # forward and backward captured as one CUDA graph each: the GPU's side alone
            "graph_serial_ms": graph_ms["serial"], "graph_concurrent_ms": graph_ms["concurrent"],
            "graph_speedup": graph_ms["serial"] / graph_ms["concurrent"],
            "graph_control": graph_ms["serial"] / graph_ms["control"],
            # delegation on: the same, the layers ucudnn would not speed up left to torch's kernels
            **{f"{way}_{name}_delegated_ms": times[f"{name}_delegated"]
               for way, times in (("eager", ms), ("graph", graph_ms)) for name in ("serial", "concurrent")},
            "delegated_kernels": delegated[0], "kernels": delegated[1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out")
    parser.add_argument("--models", default="googlenet,inception_v3,resnet50,alexnet")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--training", default="googlenet:32", help="MODEL:BATCH,... graphed training steps")
    parser.add_argument("--no-backward", dest="backward", action="store_false")
    parser.add_argument("--copies", default="2,4", help="N,...: each row's ceiling, N independent copies side by side")
    parser.add_argument("--deadline", type=float, default=560)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began, rows, backward = time.time(), [], None
    copies = tuple(int(n) for n in args.copies.split(",") if n)
    runs = [(inference_row, m, b) for m in args.models.split(",") for b in map(int, args.batches.split(","))]
    runs += [(training_row, m, int(b)) for m, b in (s.split(":") for s in args.training.split(",") if s)]
    for row_of, model, batch in runs:
        if time.time() - began > args.deadline:
            break
        try:
            rows.append(row_of(model, batch, args.streams, copies))
        except Exception as exc:  # failures are data: the row says what went wrong
            rows.append({"model": model, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:300]})
        (out / "streams.json").write_text(json.dumps({"inference": rows}, indent=1))
        print(markdown(rows[-1:], None), flush=True)
    if args.backward and time.time() - began < args.deadline:
        backward = backward_row()
    (out / "streams.json").write_text(json.dumps({"inference": rows, "backward": backward}, indent=1))
    (out / "streams.md").write_text(markdown(rows, backward))
    print(markdown(rows, backward))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
