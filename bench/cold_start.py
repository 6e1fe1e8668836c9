"""Cold start: benchmarking + optimizing from an empty cache, and a second process that uses it.

The bars: benchmarking and optimizing torchvision AlexNet (B=256, fp32, powerOfTwo, 64 MiB per
kernel, the engines backend) from an empty cache takes <= 60 s; a second process using that cache
reaches its first micro-batched training iteration in <= 5 s.

(a) the sweep, two fresh processes one after the other into an empty database (OUT/coldstart.db):
        python3 -m ucudnn bench --net torchvision:alexnet --batch 256 --dtype float32 \
            --policy powerOfTwo --backend engines --cache DB --json
        python3 -m ucudnn optimize (the same) --workspace 64MiB --json
    timed by the parent (time.perf_counter around each process); `bench` reports its measuring
    part itself (its JSON's `seconds`: from the traced network to the last measurement), the rest
    of its wall time being interpreter start-up, imports and tracing the network.
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
Results: OUT/cold_start.json and OUT/cold_start.md.

    PYTHONPATH=. python3 bench/cold_start.py --out OUT [--deadline 150] [--backend engines]
        [--limit 64MiB] [--batch 256]
"""
from __future__ import annotations

import time

STARTED_AT = time.time()  # first: the child's milestone of the interpreter reaching this file

import argparse  # noqa: E402
import contextlib  # noqa: E402
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

def cli_command(action: str, args) -> list[str]:
    """`python -m ucudnn bench|optimize` for the sweep of (a)."""
    command = [sys.executable, "-m", "ucudnn", action, "--net", NET, "--batch", str(args.batch), "--dtype", "float32",
               "--policy", "powerOfTwo", "--backend", args.backend, "--cache", str(args.cache), "--json"]
    return command + (["--workspace", args.limit] if action == "optimize" else [])


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


def sweep_summary(bench: dict, optimize: dict) -> dict:
    """(a) from the two processes' records (wall_s, document: the --json output)."""
    measured, plan = bench.get("document") or {}, optimize.get("document") or {}
    kernels = plan.get("kernels", [])
    return dict(bench_wall_s=bench.get("wall_s"), bench_measuring_s=measured.get("seconds"),
                optimize_wall_s=optimize.get("wall_s"),
                total_s=None if bench.get("wall_s") is None or optimize.get("wall_s") is None
                else bench["wall_s"] + optimize["wall_s"],
                kernels=measured.get("kernels"), sizes=measured.get("sizes"), device=measured.get("device"),
                planned_ms=plan.get("total", {}).get("time_ms"),
                planned_micro_batched=sum(1 for k in kernels if len(k["configuration"]["micro"]) > 1),
                errors=[r["error"] for r in (bench, optimize) if r.get("error")])


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
    sweep, first = report["sweep"], report["second_process"]
    total, reached = sweep.get("total_s"), first.get("first_micro_batched_s")
    notes = []
    errors = "; ".join(sweep["errors"])
    if total is None:
        notes.append(f"Bar (a) sweep <= {SWEEP_BAR_S:.0f} s: not evaluated ({errors or 'not run'})")
    else:
        passed = total <= SWEEP_BAR_S and not errors
        measuring = sweep["bench_measuring_s"]
        notes.append(f"Bar (a) sweep <= {SWEEP_BAR_S:.0f} s: {total:.1f} s ({'PASS' if passed else 'FAIL'}; bench "
                     f"{sweep['bench_wall_s']:.1f} s, of which measuring "
                     f"{'-' if measuring is None else f'{measuring:.1f} s'}, optimize {sweep['optimize_wall_s']:.1f} s"
                     f"{'; ' + errors if errors else ''})")
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
    sweep = report["sweep"]
    if sweep.get("kernels"):
        lines += ["", f"(a): {sweep['kernels']} kernels measured at sizes {sweep['sizes']} on {sweep['device']}; "
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
    record = dict(wall_s=time.perf_counter() - began, stdout=done.stdout, stderr_tail=done.stderr[-3000:])
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
    bench = run_process(cli_command("bench", args), env, min(args.sweep_timeout, left() - 30))
    optimize = run_process(cli_command("optimize", args), env, min(60, left() - 20))
    report = dict(batch=args.batch, limit=args.limit, backend=args.backend, database=str(database),
                  sweep=sweep_summary(bench, optimize), rows_after_sweep=rows_in(database))
    command = [sys.executable, __file__, "--child", "--cache", str(database), "--limit", args.limit,
               "--batch", str(args.batch), "--spawned-at"]
    spawned_at = time.time()
    child = run_process(command + [repr(spawned_at)], env, min(60, left() - 5))
    report.update(second_process=first_iteration_summary(child), cudnn_versions=cudnn_versions_in(database),
                  rows_added_by_second_process=rows_in(database) - report["rows_after_sweep"],
                  logs=dict(bench=bench.get("stderr_tail"), optimize=optimize.get("stderr_tail"),
                            child=child.get("stderr_tail")),
                  elapsed_s=time.perf_counter() - started)
    return report


def child(args) -> None:
    """(b): prints milestones since the launch, then one RESULT line."""
    def mark(name: str, at: float | None = None) -> None:
        print(milestone_line(name, (time.time() if at is None else at) - args.spawned_at), flush=True)

    mark("interpreter", STARTED_AT)
    import torch
    torch.backends.cudnn.version()  # torch's libcudnn first, so ucudnn binds the same library
    mark("import torch")
    import torchvision
    mark("import torchvision")
    import ucudnn.torch as ut
    mark("import ucudnn.torch")
    import cupy  # noqa: F401  (ucudnn's GPU side imports it on first use; here, to time it apart)
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
    ut.convert(model, workspace_limit=args.limit, cache_path=args.cache)
    context = next(m.ucudnn_context for m in model.modules() if isinstance(m, ut.Conv2d))
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
    parser.add_argument("--deadline", type=float, default=150, help="seconds for the whole run")
    parser.add_argument("--sweep-timeout", type=float, default=120, help="seconds for `ucudnn bench`")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
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
