"""Cold start on models nobody here planned: the first converted training iteration against
torch's own, in fresh processes, from an empty benchmark database and then from the filled one.

Models (built here, not in ucudnn.core.nets): timm resnet50d, efficientnet_b0 and convnext_tiny in AMP
fp16 channels_last at B = 32, torchvision resnet50 in fp32 at B = 64 (`pretrained=False`); torchvision
alexnet in fp32 at B = 256 where --models names it (gpu_suite.sh's `coldstart`). For each:
(t) torch: a fresh process, cudnn.benchmark on, times its first and second training iteration
    (forward, cross-entropy, backward, SGD step; synchronized; wall clock, cuDNN start-up included),
    after the model's ucudnn processes; --torch-runs of them, the fastest counting.
Every cold and torch process starts as on a fresh machine: the libraries read into the page
cache beforehand (read_libraries), JIT caches of its own, empty (jit_caches); the first process
to run a model on a machine was 17-22 s slower than the next, torch's or ucudnn's alike.
For each limit (64 MiB, 8 MiB per kernel; WR, delegation on, the pruned search):
(c) cold: a fresh process converts the model (ucudnn.torch.convert, cache_path = a new database)
    and times its first iteration (planning included; the progress line goes to the log), its
    second, then checks every conv weight gradient of one more step against the same model run in
    float64 by torch, and torch's own gradients likewise (the control): the relative L2 error of
    each, the worst layer reported.
(w) warm: a fresh process on the database (c) filled: its first iteration, then its iterations
    until nothing waits for a plan; at 64 MiB then the steady state against torch's own in the
    same process (memory free): the same model object, its layers turned into torch's nn.Conv2d
    and back between rounds (as_class), torch's turn twice (the A/A control): ROUNDS rounds of
    ITERS iterations each, taking turns, CUDA events, medians.
(f) at 8 MiB, offline: the kernels (c) swept, planned by WR from its pruned measurements and from
    a full sweep of them (every candidate at every size, into a copy of the database): the sums of
    their predicted times.
Bars (issue "cold start"): (c) <= 2x (t) at 64 MiB and <= 3x at 8 MiB; (w) <= (t) + 2 s; steady
>= 0.97x torch's; (f) pruned within 5% of full; gradients within fp16 tolerance (worst layer's
relative error <= max(1e-2, 3x the control's)).

    PYTHONPATH=. python3 bench/cold_models.py --out OUT [--models resnet50d,...] [--limits 64MiB,8MiB]
        [--deadline 560] [--rounds 5] [--iters 10] [--planning first_call]

By default (planning="between_iterations") every layer runs torch's own convolution in the
first iteration, nothing timed there, and is planned at the start of the next ones (about 1 s
each, at least one layer): (c) and (w) also report the iterations until nothing waits
(`until_planned_s`). --planning first_call plans inside the first iteration.
"""
from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.common import host_profile, median_iteration_ms, relative_error  # noqa: E402

MODELS = {  # name -> (source, precision, batch)
    "resnet50d": ("timm", "amp", 32),
    "efficientnet_b0": ("timm", "amp", 32),
    "convnext_tiny": ("timm", "amp", 32),
    "resnet50": ("torchvision", "fp32", 64),
    "alexnet": ("torchvision", "fp32", 256),  # the `coldstart` stage alone: AlexNet's cold start
}
DEFAULT_MODELS = "resnet50d,efficientnet_b0,convnext_tiny,resnet50"
LIMITS = ("64MiB", "8MiB")
STEADY_LIMIT = "64MiB"  # the bars: the steady state at 64 MiB, the pruned search against a full one at 8 MiB
RESULT = "RESULT "
GRAD_FLOOR = 1e-2  # relative L2 error of a weight gradient that fp16 rounding alone can reach
FIRST_BARS = {"64MiB": 2.0, "8MiB": 3.0}
WARM_EXTRA_S, STEADY_BAR, PRUNED_BAR = 2.0, 0.97, 0.05
LOSS_SCALE = 2.0**12
CHILD_TIMEOUT_S = 300.0  # no one process may take the whole deadline


# --- pure parts ---------------------------------------------------------------------------------

def verdicts(torch_run: dict, cold: dict, warm: dict, full: dict | None, limit: str) -> dict:
    """Each bar of the module's docstring: met (True/False) or not measured (None)."""
    def ratio(a, b):
        return None if a is None or b is None else a / b

    first = ratio(cold.get("first_s"), torch_run.get("first_s"))
    grads = cold.get("grads") or {}
    out = {"first_ratio": first, "first_ok": None if first is None else first <= FIRST_BARS[limit],
           "warm_ok": None if warm.get("first_s") is None or torch_run.get("first_s") is None
           else warm["first_s"] <= torch_run["first_s"] + WARM_EXTRA_S}
    if grads:
        out["grads_ok"] = grads["worst"] <= max(GRAD_FLOOR, 3 * grads["control_worst"])
    steady = warm.get("steady")
    if steady:
        out["steady_ok"] = steady["torch_over_ucudnn"] >= STEADY_BAR
    if full and full.get("full_ms"):
        out["pruned_over_full"] = full["pruned_ms"] / full["full_ms"]
        out["pruned_ok"] = out["pruned_over_full"] <= 1 + PRUNED_BAR
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| model | limit | torch first (s) | cold first (s) | ratio | warm first (s) | planning (s) | "
             "kernels swept / delegated unswept | steady torch/ucudnn | pruned/full predicted | worst grad err "
             "(control) |", "|" + "---|" * 11]
    for r in (r for r in rows if "limit" in r):  # the page cache's row has none
        cold, warm, v = r.get("cold", {}), r.get("warm", {}), r.get("verdicts", {})
        s = cold.get("summary", {})
        grads = cold.get("grads") or {}
        lines.append("| " + " | ".join([
            r["model"], r["limit"], _f(r.get("torch", {}).get("first_s")), _f(cold.get("first_s")),
            _f(v.get("first_ratio"), 2), _f(warm.get("first_s")), _f(s.get("planning_s")),
            f"{s.get('swept', '-')} / {s.get('unswept', '-')}", _steady(warm.get("steady")),
            _f(v.get("pruned_over_full"), 3),
            f"{_f(grads.get('worst'), 4, 'e')} ({_f(grads.get('control_worst'), 4, 'e')})"]) + " |")
    return "\n".join(lines) + "\n"


def _steady(steady: dict | None) -> str:
    if not steady:
        return "-"
    return f"{steady['torch_over_ucudnn']:.3f} (A/A {steady['torch_over_control']:.3f})"


def _f(value, digits: int = 1, kind: str = "f") -> str:
    return "-" if value is None else f"{value:.{digits}{kind}}"


# --- the GPU side -------------------------------------------------------------------------------

def build(name: str):
    import torch

    source, precision, batch = MODELS[name]
    if source == "timm":
        import timm

        model = timm.create_model(name, pretrained=False)
    else:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
    amp = precision == "amp"
    fmt = torch.channels_last if amp else torch.contiguous_format
    model = model.cuda().to(memory_format=fmt).train()
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, device="cuda", generator=generator).contiguous(memory_format=fmt)
    target = torch.randint(0, 1000, (batch,), device="cuda", generator=generator)
    return model, x, target, amp


def phases(model, x, target, amp: bool) -> dict:
    """The phases of a training iteration of `model` (its own SGD optimizer and GradScaler), by
    name, to be run in order: forward (and the loss), backward, optimizer step."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    loss = None

    def forward():
        nonlocal loss
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), target)

    def update():
        scaler.step(optimizer)
        scaler.update()
    return {"forward_s": forward, "backward_s": lambda: scaler.scale(loss).backward(), "step_s": update}


def stepper(model, x, target, amp: bool):
    """One training iteration of `model` (its own SGD optimizer and GradScaler)."""
    steps = phases(model, x, target, amp).values()

    def step():
        for run in steps:
            run()
    return step


def timed_s(step) -> float:
    import torch

    began = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def conv_grads(model, x, target, amp: bool, seed: int = 1, scale: float | None = None) -> dict:
    """Every conv weight gradient of one forward and backward (no step), by module name; in AMP
    the loss scaled by LOSS_SCALE, as a GradScaler would, so that no fp16 gradient underflows
    (`scale`: that factor whatever `amp` says)."""
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        loss = torch.nn.functional.cross_entropy(model(x), target)
    (loss * (scale if scale is not None else LOSS_SCALE if amp else 1.0)).backward()
    return {n: m.weight.grad.detach().clone() for n, m in model.named_modules()
            if isinstance(m, torch.nn.Conv2d) and m.weight.grad is not None}


def plain_copy(model):
    """`model` deep-copied with its converted layers back to torch's own nn.Conv2d."""
    import torch

    twin = copy.deepcopy(model)
    for m in twin.modules():
        if isinstance(m, torch.nn.Conv2d) and type(m) is not torch.nn.Conv2d:
            m.__class__ = torch.nn.Conv2d
    return twin


def grad_check(model, x, target, amp: bool) -> dict:
    """Relative error of ucudnn's conv weight gradients and of torch's own (same weights, input
    and RNG), each against the model run in float64 by torch: the worst layer of each. (torch's
    own with cudnn.benchmark off is no control: its plan cache answers alike either way.)"""
    reference = plain_copy(model)
    got = conv_grads(model, x, target, amp)
    want = conv_grads(reference, x, target, amp)
    exact = conv_grads(plain_copy(reference).double(), x.double(), target, amp=False,
                       scale=LOSS_SCALE if amp else 1.0)
    errors = {n: relative_error(got[n], exact[n]) for n in exact}
    controls = {n: relative_error(want[n], exact[n]) for n in exact}
    worst = max(errors, key=errors.get)
    return {"layers": len(errors), "worst": errors[worst], "worst_layer": worst,
            "control_worst": max(controls.values()), "control_at_worst": controls[worst],
            "median": statistics.median(errors.values()), "control_median": statistics.median(controls.values()),
            "ucudnn_vs_torch_worst": max(relative_error(got[n], want[n]) for n in want)}


def steady(steps: dict, rounds: int, iters: int) -> dict:
    """Median ms per iteration of each step, the steps taking turns as train_ab.py's do (who goes
    first rotating), a CUDA event after each iteration; and the median host ms a step's call took
    (where it is about the iteration's, the host sets the pace and host costs count whole)."""
    timed, host = host_timed(steps)
    medians = median_iteration_ms(timed, rounds, iters)
    return {"ms": medians, "host_ms": {n: statistics.median(s) * 1e3 for n, s in host.items()},
            "torch_over_ucudnn": medians["torch"] / medians["ucudnn"],
            "torch_over_control": medians["torch"] / medians["control"]}


def host_timed(steps: dict) -> tuple[dict, dict[str, list[float]]]:
    """`steps` each wrapped to note the host seconds of every call, and those seconds by name."""
    host: dict[str, list[float]] = {name: [] for name in steps}

    def timed(name, step):
        def run():
            began = time.perf_counter()
            step()
            host[name].append(time.perf_counter() - began)
        return run
    return {name: timed(name, step) for name, step in steps.items()}, host


def child(args) -> dict:
    import torch

    torch.backends.cudnn.benchmark = True
    torch.zeros(1, device="cuda")  # the CUDA context, as every process starts it before training
    model, x, target, amp = build(args.model)
    out = {}
    if args.child != "torch":
        import ucudnn.torch as ut

        ut.convert(model, workspace_limit=args.limit, cache_path=args.cache, planning=args.planning)
    step = stepper(model, x, target, amp)
    out["first_s"] = timed_s(step)
    out["second_s"] = timed_s(step)
    if args.child == "torch":
        return out
    out["until_planned_s"] = []  # planning between iterations: the iterations that still plan
    while ut.context_of(model).summary()["pending"] and len(out["until_planned_s"]) < 60:
        out["until_planned_s"].append(timed_s(step))
    summary = ut.context_of(model).summary()
    out["summary"] = {"planning_s": summary["planning_s"], "search": summary["search"],
                      "kernels": len(summary["kernels"]), "swept": sum(k["swept"] for k in summary["kernels"]),
                      "unswept": sum(not k["swept"] for k in summary["kernels"]),
                      "delegated": sum(k["delegated"] for k in summary["kernels"]), "runs": summary["runs"],
                      "slowest": sorted(({"kernel": k["kernel"], "planning_s": k["planning_s"], "swept": k["swept"]}
                                         for k in summary["kernels"]), key=lambda k: -k["planning_s"])[:5]}
    if args.child == "cold":
        out["grads"] = grad_check(model, x, target, amp)
        context = ut.context_of(model)
        out["swept_problems"] = [call.problem(kind).to_dict() for (kind, call, _) in context.planner.kernels.planned]
    if args.child == "warm" and args.steady:
        convs = [m for m in model.modules() if isinstance(m, ut.Conv2d)]
        steps = {"ucudnn": as_class(convs, ut.Conv2d, step), "torch": as_class(convs, torch.nn.Conv2d, step),
                 "control": as_class(convs, torch.nn.Conv2d, step)}  # torch's own again: the A/A noise
        for s in steps.values():
            s()
        out["steady"] = steady(steps, args.rounds, args.iters)
        out["host_profile"] = {n: host_profile(steps[n], args.iters, 15, ("tottime",))[1] for n in ("ucudnn", "torch")}
    return out


def as_class(convs: list, cls, step):
    """`step` with the layers `convs` of its model turned into `cls` first: one model object,
    parameters, optimizer and allocations, run by ucudnn (ucudnn.torch.Conv2d) or by torch
    (nn.Conv2d). (Two copies of a model differed by up to 6% with no ucudnn in either: the A/A
    spread of the earlier harness, docs/results.md.) Every step pays the same turning."""
    def run():
        for m in convs:
            m.__class__ = cls
        step()
    return run


def full_sweep(args) -> dict:
    """WR's predicted time of the swept kernels from the pruned measurements and from a full sweep."""
    from ucudnn.core.problem import ConvProblem, Kernel
    from ucudnn.measure.benchmark import CudnnBenchmarker, ensure_tables
    from ucudnn.measure.cache import Cache
    from ucudnn.optimizers.search import named
    from ucudnn.plan.config import Settings
    from ucudnn.plan.solve import solve_wr

    problems = [ConvProblem.from_dict(d) for d in json.loads(Path(args.problems).read_text())]
    settings = Settings.load(workspace_limit=args.limit)
    limit = settings.workspace_limit
    benchmarker = CudnnBenchmarker(execution=settings.execution, backend=settings.backend)
    out, began = {"kernels": len(problems)}, time.perf_counter()
    for search in ("pruned", "full"):
        cache = Cache(args.cache)
        try:
            tables = ensure_tables(problems, settings.sizes_for, limit, cache, benchmarker, search=named(search))
        finally:
            cache.close()
        out[f"{search}_ms"] = sum(solve_wr(Kernel(p.describe(), p), tables[p.key], settings, limit).time_ms
                                  for p in problems)
        out[f"{search}_s"] = time.perf_counter() - began
        print(f"{search}: {out}", file=sys.stderr, flush=True)  # what a cut run still shows
    out["calls"] = benchmarker.calls
    return out


# --- the parent ---------------------------------------------------------------------------------

def jit_caches() -> dict[str, str]:
    """Environment variables giving a child process JIT caches of its own, empty, so that it
    compiles what a process on a fresh machine compiles: the CUDA driver's (CUDA_CACHE_PATH,
    where runtime-compiled kernels land) and CuPy's (CUPY_CACHE_DIR). A process's first iteration was 17-22 s longer where no earlier
    process had run the model on that machine, whether torch's or ucudnn's, with the libraries
    already read (docs/results.md, "Cold start")."""
    folder = tempfile.mkdtemp(prefix="cold-models-jit-")
    return {"CUDA_CACHE_PATH": folder, "CUPY_CACHE_DIR": str(Path(folder) / "cupy")}


def run_child(args, log: Path, timeout: float, jit: dict | None = None, **flags) -> dict:
    """A child process of this script with `flags` (None values left out) and the environment
    variables `jit` (jit_caches), its result (RESULT line) or the error; its output to `log`."""
    command = [sys.executable, __file__, "--out", str(args.out)]
    for key, value in ((k, v) for k, v in flags.items() if v is not None):
        command += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    began = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(jit or {})},
                              timeout=max(min(timeout, CHILD_TIMEOUT_S), 1))
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        text, code = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after {timeout:.0f} s", "timeout"
    with log.open("a") as f:
        f.write(f"$ {' '.join([*(f'{k}={v}' for k, v in (jit or {}).items()), *command])}\n{text}\n")
    found = [json.loads(line[len(RESULT):]) for line in text.splitlines() if line.startswith(RESULT)]
    result = found[-1] if found else {"error": f"exit {code}: {text.strip().splitlines()[-1:] or ''}"}
    result["process_s"] = time.time() - began
    return result


def parent(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log, rows = out / "cold_models.log", []
    deadline = STARTED + args.deadline

    def left() -> float:
        return deadline - time.time() - 10

    def save():
        (out / "cold_models.json").write_text(json.dumps(rows, indent=1))
        (out / "cold_models.md").write_text(markdown(rows))

    rows.append({"page_cache": read_libraries()})

    limits = [limit for limit in args.limits.split(",") if limit]  # --limits= : torch alone
    for model in args.models.split(","):
        model_rows = [measured(args, log, out, model, limit, left) for limit in limits if left() >= 30]
        rows.extend(model_rows)
        save()
        # torch after ucudnn's processes: they read the model's cuDNN kernels from disk first
        # (a first process on a machine took 60.2 s for efficientnet_b0, the next 29.2 s)
        runs = [run_child(args, log, left(), jit_caches(), child="torch", model=model) for _ in range(args.torch_runs)]
        torch_run = min(runs, key=lambda r: r.get("first_s", float("inf")))
        torch_run["first_s_each"] = [r.get("first_s") for r in runs]
        for row in model_rows:
            row["torch"] = torch_run
            row["verdicts"] = verdicts(torch_run, row["cold"], row["warm"], row["full"], row["limit"])
        save()
        print(markdown(model_rows), flush=True)
    print(markdown(rows))


def read_libraries() -> dict:
    """Read torch's and NVIDIA's shared libraries once, so that no process measured here is the
    one that reads cuDNN's kernels from disk: the first process on a fresh machine took 21.8 s
    to torch's 3.6 s in the next (resnet50 fp32), 60.2 s to 29.2 s (efficientnet_b0)."""
    import importlib.util

    began, total = time.perf_counter(), 0
    roots = [Path(importlib.util.find_spec(name).origin).parent for name in ("torch", "nvidia")
             if importlib.util.find_spec(name) and importlib.util.find_spec(name).origin]
    roots += [Path(p) for name in ("nvidia",) if (s := importlib.util.find_spec(name)) and s.submodule_search_locations
              for p in s.submodule_search_locations]
    for library in {f for root in roots for f in root.rglob("*.so*") if f.is_file()}:
        with library.open("rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return {"bytes": total, "seconds": time.perf_counter() - began}


def measured(args, log: Path, out: Path, model: str, limit: str, left) -> dict:
    """The cold and warm processes of `model` at `limit` on a new database (the warm one at
    STEADY_LIMIT also the steady state), and at other limits the full sweep of what the cold
    one swept (its problems kept beside the database, so that a later call can sweep them:
    --child full)."""
    steady = limit == STEADY_LIMIT
    db = out / "db" / f"{model}-{limit}.db"
    db.parent.mkdir(exist_ok=True)
    db.unlink(missing_ok=True)
    jit = jit_caches()  # the warm process is the same user's second: it keeps the cold one's caches
    cold = run_child(args, log, left(), jit, child="cold", model=model, limit=limit, cache=db, planning=args.planning)
    warm = run_child(args, log, left(), jit, child="warm", model=model, limit=limit, cache=db, planning=args.planning,
                     steady=steady or None)
    full, swept = None, cold.pop("swept_problems", None)
    if swept:
        problems = out / "db" / f"{model}-{limit}.swept.json"
        problems.write_text(json.dumps(swept))
        if not steady and left() > 60 and args.full:
            copied = out / "db" / f"{model}-{limit}.full.db"
            shutil.copy(db, copied)
            full = run_child(args, log, left(), jit, child="full", model=model, limit=limit, cache=copied,
                             problems=problems)
            copied.unlink(missing_ok=True)
    return {"model": model, "limit": limit, "precision": MODELS[model][1], "batch": MODELS[model][2],
            "torch": {}, "cold": cold, "warm": warm, "full": full}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--limits", default=",".join(LIMITS))
    p.add_argument("--deadline", type=float, default=560)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-full", dest="full", action="store_false", help="skip the offline full sweep (f)")
    p.add_argument("--torch-runs", type=int, default=2, help="torch's processes per model, the fastest counting "
                   "(1 where the machine has run these libraries before: its page cache is warm)")
    p.add_argument("--child", choices=("torch", "cold", "warm", "full"))
    p.add_argument("--model", choices=tuple(MODELS))
    p.add_argument("--limit")
    p.add_argument("--cache")
    p.add_argument("--problems")
    p.add_argument("--steady", action="store_true")
    p.add_argument("--planning", help="ucudnn.torch.convert's planning setting (default: ucudnn's)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child is None:
        return parent(args)
    result = full_sweep(args) if args.child == "full" else child(args)
    print(RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
