"""Cold start: benchmarking + optimizing from an empty cache, and a second process that uses it.

The bars: benchmarking and optimizing torchvision AlexNet (B=256, fp32, powerOfTwo, 64 MiB per
kernel, the engines backend) from an empty cache takes <= 60 s; a second process using that cache
reaches its first micro-batched training iteration in <= 5 s.

(a) the sweep: one fresh process that benchmarks what the plan needs into an empty database
    (OUT/coldstart.db) and plans, as a user runs it on a GPU:
        python3 -m ucudnn optimize --net torchvision:alexnet --batch 256 --dtype float32 \
            --policy powerOfTwo --backend engines --cache DB --workspace 64MiB --json
    timed by the parent (time.perf_counter around the process, interpreter start-up included).
(b) a fresh process (this script with --child, UCUDNN_BACKEND as in (a)) that builds
    torchvision.models.alexnet(weights=None) on the GPU, converts it with
    ucudnn.torch.convert(workspace_limit=64MiB, cache_path=DB), runs one training iteration
    (forward, cross-entropy, backward, SGD step; B=256, fp32), synchronizes, and runs a second.
    Clock: the parent passes time.time() taken just before it starts the process; the child
    prints each milestone as time.time() minus that, so every milestone counts from the process's
    launch, interpreter start-up included (one host, one clock). Milestones: the interpreter
    running this file, imports (torch, torchvision, ucudnn.torch, CuPy), the CUDA context, the
    model on the GPU, convert, the ucudnn handle (cuDNN handle, backend set-up), the first
    forward, the first iteration, the second. The first iteration minus the second is what
    planning from the cache (and cuDNN's lazy loading) cost; the database's row count before and
    after (b) says whether (b) had to measure anything.
(c) the control: the same child with --torch-only (no ucudnn: torch's own convolutions, its
    cudnn.benchmark off) gives what torch alone takes to its first iteration, the floor that
    (b)'s imports of torch and torchvision sit on.
(d) the drop-in handle, no torch: a fresh process (--handle-only) that imports ucudnn and CuPy,
    makes a ucudnn.Handle on the database, and runs the network's conv kernels (F, BD and BF of
    every layer, from the shipped table) once through Handle.convolve on CuPy arrays: ucudnn's
    own start to a micro-batched iteration of the convolutions, as a framework using the handle
    (or a C++ program through it) meets it; then a second iteration.
Results: OUT/cold_start.json and OUT/cold_start.md.

    PYTHONPATH=. python3 bench/cold_start.py --out OUT [--deadline 200] [--backend engines]
        [--limit 64MiB] [--batch 256]
"""
from __future__ import annotations

import time

STARTED_AT = time.time()  # first: the child's milestone of the interpreter reaching this file

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SWEEP_BAR_S = 60.0
FIRST_ITERATION_BAR_S = 5.0
NET = "torchvision:alexnet"
MILESTONE = "MILESTONE"
RESULT = "RESULT"
FIRST_ITERATION = "first iteration"


# --- pure parts ---------------------------------------------------------------------------------------

def after_imports(milestones: list[tuple[str, float]]) -> float | None:
    """Seconds from torch and torchvision imported to the first iteration: the part of a start
    that is not the two imports every torchvision user pays (and whose time varies most)."""
    at = dict(milestones)
    if not {"import torchvision", FIRST_ITERATION} <= at.keys():
        return None
    return at[FIRST_ITERATION] - at["import torchvision"]


def sweep_command(args) -> list[str]:
    """`python -m ucudnn optimize` from an empty cache: the sweep of (a)."""
    return [sys.executable, "-m", "ucudnn", "optimize", "--net", NET, "--batch", str(args.batch), "--dtype", "float32",
            "--policy", "powerOfTwo", "--backend", args.backend, "--cache", str(args.cache), "--json",
            "--workspace", args.limit]


def json_document(text: str) -> dict | None:
    """The JSON object a `--json` command printed (from its first line that opens one), or None."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("{")), None)
    if start is None:
        return None
    try:
        return json.loads("\n".join(lines[start:]))
    except json.JSONDecodeError:
        return None


def milestone_line(name: str, seconds: float) -> str:
    return f"{MILESTONE} {seconds:.4f} {name}"


def parse_child(stdout: str) -> tuple[list[tuple[str, float]], dict]:
    """(milestones in order as (name, seconds since launch), the RESULT object) of the child's stdout;
    other lines (warnings, progress) are ignored."""
    milestones, result = [], {}
    for line in stdout.splitlines():
        if line.startswith(MILESTONE + " "):
            _, seconds, name = line.split(" ", 2)
            milestones.append((name, float(seconds)))
        elif line.startswith(RESULT + " "):
            result = json.loads(line[len(RESULT) + 1:])
    return milestones, result


def phases(milestones: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Seconds each milestone took after the one before it (the first: after the launch)."""
    return [(name, seconds - (milestones[i - 1][1] if i else 0.0)) for i, (name, seconds) in enumerate(milestones)]


def until(milestones: list[tuple[str, float]], name: str) -> float | None:
    return dict(milestones).get(name)


def dominant(milestones: list[tuple[str, float]], name: str = FIRST_ITERATION) -> tuple[str, float] | None:
    """The longest phase up to milestone `name` (what dominated reaching it)."""
    names = [n for n, _ in milestones]
    if name not in names:
        return None
    return max(phases(milestones)[:names.index(name) + 1], key=lambda phase: phase[1])


def first_over_second(milestones: list[tuple[str, float]]) -> float | None:
    """How much longer the first iteration took than the second: planning from the cache, graph
    capture and cuDNN's lazy loading (None where the second did not run)."""
    at = dict(milestones)
    if not {"ucudnn handle", FIRST_ITERATION, "second iteration"} <= at.keys():
        return None
    return (at[FIRST_ITERATION] - at["ucudnn handle"]) - (at["second iteration"] - at[FIRST_ITERATION])


def sweep_summary(sweep: dict) -> dict:
    """(a) from the process's record (wall_s, document: its --json output, error)."""
    plan = sweep.get("document") or {}
    kernels = plan.get("kernels", [])
    error = sweep.get("error") or (None if plan or sweep.get("wall_s") is None else "no JSON document in its output")
    return dict(total_s=sweep.get("wall_s"), measured=plan.get("measured"), kernels=len(kernels) or None,
                device=plan.get("device"), planned_ms=plan.get("total", {}).get("time_ms"),
                planned_micro_batched=sum(1 for k in kernels if len(k["configuration"]["micro"]) > 1),
                errors=[error] if error else [])


def first_iteration_summary(child: dict) -> dict:
    """(b) from the child's record (wall_s, stdout, error)."""
    milestones, result = parse_child(child.get("stdout", ""))
    reached = until(milestones, FIRST_ITERATION)
    micro_batched = result.get("micro_batched", 0)
    return dict(wall_s=child.get("wall_s"), milestones=milestones, phases=phases(milestones),
                first_iteration_s=reached, micro_batched=micro_batched, kernels=result.get("kernels"),
                via_torch=result.get("via_torch"), fallbacks=result.get("fallbacks"),
                first_micro_batched_s=reached if micro_batched else None, dominant=dominant(milestones),
                first_over_second_s=first_over_second(milestones),
                result=result, error=child.get("error"))


def verdicts(report: dict) -> list[str]:
    sweep, first, control = report["sweep"], report["second_process"], report.get("torch_only")
    total, reached = sweep.get("total_s"), first.get("first_micro_batched_s")
    notes = []
    errors = "; ".join(sweep["errors"])
    if total is None:
        notes.append(f"Bar (a) sweep <= {SWEEP_BAR_S:.0f} s: not evaluated ({errors or 'not run'})")
    else:
        passed = total <= SWEEP_BAR_S and not errors
        notes.append(f"Bar (a) sweep <= {SWEEP_BAR_S:.0f} s: {total:.1f} s ({'PASS' if passed else 'FAIL'}; one "
                     f"`ucudnn optimize` process from an empty cache{'; ' + errors if errors else ''})")
    if reached is not None:
        notes.append(f"Bar (b) first micro-batched iteration <= {FIRST_ITERATION_BAR_S:.0f} s after launch: "
                     f"{reached:.2f} s ({'PASS' if reached <= FIRST_ITERATION_BAR_S else 'FAIL'})")
    elif first.get("first_iteration_s") is not None:
        notes.append(f"Bar (b): FAIL, the first iteration ran ({first['first_iteration_s']:.2f} s) but no kernel "
                     "was micro-batched")
    else:
        notes.append(f"Bar (b): not reached ({first.get('error') or 'no first-iteration milestone'})")
    if first.get("dominant"):
        name, seconds = first["dominant"]
        notes.append(f"(b) dominated by: {name} ({seconds:.2f} s)")
    floor = (control or {}).get("first_iteration_s")
    if floor is not None and first.get("first_iteration_s") is not None:
        ours, theirs = after_imports(first["milestones"]), after_imports(control["milestones"])
        notes.append(f"(c) torch alone reaches its first iteration in {floor:.2f} s (imports of torch and "
                     f"torchvision: {until(control['milestones'], 'import torchvision'):.2f} s); from those imports "
                     f"on, {ours:.2f} s with ucudnn vs {theirs:.2f} s without: ucudnn's part is {ours - theirs:.2f} s")
    handle = report.get("handle_only") or {}
    if handle.get("first_micro_batched_s") is not None:
        notes.append(f"(d) the drop-in handle without torch: the conv kernels' first micro-batched iteration "
                     f"{handle['first_micro_batched_s']:.2f} s after launch "
                     f"({'PASS' if handle['first_micro_batched_s'] <= FIRST_ITERATION_BAR_S else 'FAIL'} "
                     f"against {FIRST_ITERATION_BAR_S:.0f} s)")
    elif handle:
        notes.append(f"(d) the drop-in handle: not reached ({handle.get('error') or 'no micro-batched iteration'})")
    added = report.get("rows_added_by_second_process")
    if added:
        notes.append(f"(b) measured {added} rows the sweep had not (a cache miss: see cudnn_versions)")
    return notes


def markdown(report: dict) -> str:
    first = report["second_process"]
    lines = [f"# Cold start: AlexNet B={report['batch']} fp32 powerOfTwo, {report['limit']} per kernel, "
             f"backend {report['backend']}", "", *(f"- {note}" for note in verdicts(report)), "",
             "## (b) milestones of the second process (seconds since launch)", "",
             "| milestone | since launch s | phase s |", "|---|---|---|"]
    lines += [f"| {name} | {at:.3f} | {phase:.3f} |"
              for (name, at), (_, phase) in zip(first["milestones"], first["phases"])]
    control = report.get("torch_only") or {}
    if control.get("milestones"):
        lines += ["", "## (c) milestones of torch alone", "", "| milestone | since launch s | phase s |",
                  "|---|---|---|"]
        lines += [f"| {name} | {at:.3f} | {phase:.3f} |"
                  for (name, at), (_, phase) in zip(control["milestones"], control["phases"])]
    handle = report.get("handle_only") or {}
    if handle.get("milestones"):
        lines += ["", "## (d) milestones of the drop-in handle without torch", "",
                  "| milestone | since launch s | phase s |", "|---|---|---|"]
        lines += [f"| {name} | {at:.3f} | {phase:.3f} |"
                  for (name, at), (_, phase) in zip(handle["milestones"], handle["phases"])]
    sweep = report["sweep"]
    if sweep.get("kernels"):
        lines += ["", f"(a): {sweep['kernels']} kernels planned on {sweep['device']}; "
                  f"plan {sweep['planned_ms'] or float('nan'):.2f} ms predicted, {sweep['planned_micro_batched']} "
                  "kernels micro-batched"]
    lines += ["", f"Database rows after (a): {report.get('rows_after_sweep')}, cuDNN versions in it: "
              f"{report.get('cudnn_versions')}", ""]
    return "\n".join(lines)


# --- the processes --------------------------------------------------------------------------------------

def child_env(args) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, UCUDNN_BACKEND=args.backend)


def run_process(command: list[str], env: dict[str, str], timeout: float) -> dict:
    """Wall seconds (perf_counter), stdout, the tail of stderr, and an error where it failed."""
    print("$ " + " ".join(command), flush=True)
    began = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return dict(wall_s=time.perf_counter() - began, stdout=stdout, error=f"timed out after {timeout:.0f} s")
    record = dict(wall_s=time.perf_counter() - began, stdout=done.stdout, stderr_tail=done.stderr[-3000:],
                  document=json_document(done.stdout))
    print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)
    if done.returncode:
        last_line = (done.stderr.strip().splitlines() or [""])[-1]
        record["error"] = f"exit code {done.returncode}: {last_line}"
    return record


def query(database: Path, sql: str) -> list[tuple]:
    """Rows of `sql` on the benchmark database ([] where there is none yet)."""
    if not database.exists():
        return []
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return connection.execute(sql).fetchall()


def rows_in(database: Path) -> int:
    return sum(n for (n,) in query(database, "SELECT count(*) FROM measurements"))


def cudnn_versions_in(database: Path) -> list[int]:
    return [v for (v,) in query(database, "SELECT DISTINCT cudnn_version FROM measurements")]


def empty(database: Path) -> None:
    """No database at `database`, nor its SQLite side files from an earlier run."""
    for path in (database, *(database.with_name(database.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        path.unlink(missing_ok=True)


def parent(args) -> dict:
    started = time.perf_counter()
    left = lambda: args.deadline - (time.perf_counter() - started)  # noqa: E731
    database = Path(args.cache)
    empty(database)
    env = child_env(args)
    sweep = run_process(sweep_command(args), env, min(args.sweep_timeout, left() - 60))
    report = dict(batch=args.batch, limit=args.limit, backend=args.backend, database=str(database),
                  sweep=sweep_summary(sweep), rows_after_sweep=rows_in(database))
    command = [sys.executable, __file__, "--child", "--cache", str(database), "--limit", args.limit,
               "--batch", str(args.batch)]
    child = run_process(command + ["--spawned-at", repr(time.time())], env, min(60, left() - 30))
    rows_added = rows_in(database) - report["rows_after_sweep"]
    control = run_process(command + ["--torch-only", "--spawned-at", repr(time.time())], env, min(60, left() - 20))
    handle = run_process(command + ["--handle-only", "--spawned-at", repr(time.time())], env, min(60, left() - 5))
    report.update(second_process=first_iteration_summary(child), torch_only=first_iteration_summary(control),
                  handle_only=first_iteration_summary(handle),
                  cudnn_versions=cudnn_versions_in(database), rows_added_by_second_process=rows_added,
                  logs=dict(sweep=sweep.get("stderr_tail"), child=child.get("stderr_tail"),
                            torch_only=control.get("stderr_tail"), handle_only=handle.get("stderr_tail")),
                  elapsed_s=time.perf_counter() - started)
    return report


def marker(spawned_at: float):
    """mark(name[, at]): prints a milestone, seconds since the process's launch."""
    def mark(name: str, at: float | None = None) -> None:
        print(milestone_line(name, (time.time() if at is None else at) - spawned_at), flush=True)
    return mark


def handle_child(args) -> None:
    """(d): the conv kernels of one training iteration through ucudnn.Handle, without torch."""
    mark = marker(args.spawned_at)
    mark("interpreter", STARTED_AT)
    from ucudnn import Handle
    from ucudnn.measure.cache import Cache
    from ucudnn.core.nets import get_network
    mark("import ucudnn")
    import cupy
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))
    mark("import cupy, CUDA context")
    kernels = get_network(NET).problems(args.batch, "float32")
    operands = [(k.problem, k.count, [cupy.ones(shape, dtype=cupy.float32) for shape in
                                      (k.problem.x_shape, k.problem.w_shape, k.problem.y_shape)])
                for k in kernels]
    cupy.cuda.runtime.deviceSynchronize()
    mark("operands on the GPU")
    handle = Handle(cache=Cache(args.cache), workspace_limit=args.limit, policy="powerOfTwo")
    mark("ucudnn handle")
    for iteration in ("first", "second"):
        for problem, count, (x, w, y) in operands:
            for _ in range(count):
                handle.convolve(problem, x, w, y)
        cupy.cuda.runtime.deviceSynchronize()
        mark(f"{iteration} iteration")
    configurations = [handle.configuration(problem) for problem, _, _ in operands]
    print(RESULT + " " + json.dumps(dict(
        kernels=len(kernels), micro_batched=sum(1 for c in configurations if len(c.micro) > 1), via_torch=0,
        backend=handle.settings.backend, configurations=[c.describe() for c in configurations])), flush=True)


def child(args) -> None:
    """(b): prints milestones since the launch, then one RESULT line."""
    mark = marker(args.spawned_at)
    mark("interpreter", STARTED_AT)
    import torch
    torch.backends.cudnn.version()  # torch's libcudnn first, so ucudnn binds the same library
    mark("import torch")
    import torchvision
    mark("import torchvision")
    if not args.torch_only:
        import ucudnn.torch as ut
        mark("import ucudnn.torch")
        importlib.import_module("cupy")  # ucudnn's GPU side imports it on first use; here, to time it apart
        mark("import cupy")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    mark("CUDA context")
    torch.manual_seed(0)
    model = torchvision.models.alexnet(weights=None).to(device).train()
    x = torch.randn(args.batch, 3, 224, 224, device=device)
    target = torch.randint(0, 1000, (args.batch,), device=device)
    torch.cuda.synchronize()
    mark("model and batch on the GPU")
    if not args.torch_only:
        # the bar is the first micro-batched iteration: planned on the first call, from the cache
        ut.convert(model, workspace_limit=args.limit, cache_path=args.cache, planning="first_call")
        context = ut.context_of(model)
        mark("convert")
        context.handle(device)  # made by the first call anyway; here, to time it apart
        mark("ucudnn handle")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for iteration in ("first", "second"):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), target)
        if iteration == "first":
            torch.cuda.synchronize()
            mark("first forward")
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        mark(f"{iteration} iteration")
    if args.torch_only:
        print(RESULT + " " + json.dumps(dict(torch=torch.__version__, loss=float(loss))), flush=True)
        return
    kernels = context.summary()["kernels"]
    print(RESULT + " " + json.dumps(dict(
        kernels=len(kernels), micro_batched=sum(1 for k in kernels if k.get("parts", 1) > 1),
        via_torch=sum(1 for k in kernels if k["via"] != "ucudnn"), fallbacks=dict(context.fallbacks),
        torch=torch.__version__, cudnn=torch.backends.cudnn.version(), loss=float(loss),
        configurations=[(k["kind"], k["kernel"], k.get("configuration")) for k in kernels])), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--limit", default="64MiB", help="workspace limit per kernel")
    parser.add_argument("--backend", default="engines", choices=("all", "engines", "legacy"))
    parser.add_argument("--cache", help="the database (default OUT/coldstart.db; deleted first)")
    parser.add_argument("--deadline", type=float, default=200, help="seconds for the whole run")
    parser.add_argument("--sweep-timeout", type=float, default=120, help="seconds for the sweep")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--handle-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        (handle_child if args.handle_only else child)(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.cache = args.cache or str(out / "coldstart.db")
    report = parent(args)
    (out / "cold_start.json").write_text(json.dumps(report, indent=1))
    (out / "cold_start.md").write_text(markdown(report))
    print(markdown(report), flush=True)


if __name__ == "__main__":
    main()
