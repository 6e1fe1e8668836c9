"""Issue 7's evidence: wall time of `ucudnn bench` (AlexNet, B=256, policy all) on 1 GPU vs 2 GPUs
of one node, the MPI path with 2 ranks, and whether the three databases hold the same keys.

    python3 bench/parallel_bench.py RESULTS_DIR [--budget 530] [--batch 256] [--timing quick]

Everything it ran is logged to RESULTS_DIR (NAME.log, NAME.db) with summary.json. It keeps within
--budget seconds: two short calibration sweeps (B=32 and B=64, 1 GPU) fit t(B) = a*B + b*B(B+1)/2
(tasks, and flops summed over micro-batch sizes 1..B) and, if the 1-GPU sweep at --batch would not
leave time for the rest, the batch is lowered (to a multiple of 32) and summary.json says so.

Why --timing quick by default: in the recorded H100 database (cache/), AlexNet's `all` sweep sums
to 23 s of kernel time per call of every (kernel, algorithm, size); the default timing (warm-up
plus 3 to 10 calls) makes that about 200 s of GPU time on one GPU, too long for three runs in 9
minutes, and quick timing (warm-up plus 1 to 3 calls) about 70 s.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

SPEEDUP_WANTED = 1.7
RESERVE_S = 75  # left for the GPU test, the comparison and slack
START = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - START


def run(results: Path, name: str, command: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run, log stdout and stderr to NAME.log, and time it; the JSON summary of `bench --json` if printed."""
    print(f"=== {name} (limit {timeout:.0f} s): {' '.join(command)}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout, 1),
                              env={**os.environ, **(env or {})})
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", _text(exc.stdout), _text(exc.stderr) + f"\n!!! killed after {timeout:.0f} s"
    wall = time.monotonic() - start
    (results / f"{name}.log").write_text(f"$ {' '.join(command)}\n--- stdout\n{out}\n--- stderr\n{err}")
    result = {"rc": rc, "wall_s": round(wall, 2), "command": " ".join(command)}
    summary = _last_json(out)
    if summary:
        result["bench_s"] = round(summary["seconds"], 2)
    print(f"=== {name}: rc {rc}, {wall:.1f} s wall" + (f", {result.get('bench_s')} s in bench" if summary else ""))
    if rc != 0:
        print("\n".join(err.strip().splitlines()[-15:]))
    return result


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _last_json(out: str) -> dict | None:
    """The JSON document `bench --json` prints (the progress bar goes to stderr)."""
    try:
        return json.loads(out[out.index("{"):])
    except ValueError:
        return None


def bench_command(args, batch: int, cache: Path, devices: str, *extra: str) -> list[str]:
    backend = ("--backend", args.backend) if args.backend else ()
    return [sys.executable, "-m", "ucudnn", "bench", "--net", args.net, "--batch", str(batch), "--policy",
            args.policy, "--timing", args.timing, "--devices", devices, "--cache", str(cache), "--json",
            *backend, *extra]


# ---- how large a sweep fits


def choose_batch(args, results: Path, info: dict) -> int:
    """Time 1-GPU sweeps (a start-up one: B=1 undivided; then B=32 and 64 `all`), fit
    t(B) = start + a*B + b*B(B+1)/2, and keep the 1-GPU + 2-GPU + MPI runs within the budget."""
    seconds = {}
    for name, b, policy in (("warmup", 1, "undivided"), ("calibrate-1", 1, "undivided"),
                            ("calibrate-32", 32, args.policy), ("calibrate-64", 64, args.policy)):
        command = bench_command(args, b, results / f"{name}.db", "0")  # the warm-up compiles CuPy's kernels
        command[command.index("--policy") + 1] = policy
        r = run(results, name, command, 150)
        if r["rc"] != 0 or "bench_s" not in r:
            raise SystemExit(f"{name} failed; see {results}/{name}.log")
        seconds[b] = r["bench_s"]
    start, work = seconds[1], lambda b: b * (b + 1) / 2  # noqa: E731
    per_flop = max((seconds[64] - 2 * seconds[32] + start) / (work(64) - 2 * work(32)), 0.0)
    per_task = max((seconds[32] - start - per_flop * work(32)) / 32, 0.0)
    estimate = lambda b: start + per_task * b + per_flop * work(b)  # noqa: E731
    left = args.budget - elapsed() - RESERVE_S
    fits = lambda b: 2.2 * estimate(b) + 3 * 12 <= left  # noqa: E731  1 + 1/2 + 1/2 and slack, 3 starts
    batch = args.batch if fits(args.batch) else max([b for b in range(64, args.batch, 32) if fits(b)], default=64)
    info["calibration"] = {"bench_s": seconds, "per_task_s": per_task, "per_unit_of_work_s": per_flop,
                           "estimated_1gpu_s_at_requested_batch": round(estimate(args.batch), 1),
                           "estimated_1gpu_s_at_chosen_batch": round(estimate(batch), 1),
                           "seconds_left_for_runs": round(left, 1)}
    print(f"=== estimated 1-GPU sweep: {estimate(args.batch):.0f} s at B={args.batch}; {left:.0f} s left for runs")
    if batch != args.batch:
        info["batch_reduced"] = (f"B={args.batch} would take about {estimate(args.batch):.0f} s on 1 GPU, too long "
                                 f"for the {args.budget:.0f} s budget with the 2-GPU and MPI runs; used B={batch}")
        print(f"!!! {info['batch_reduced']}")
    return batch


# ---- MPI


def mpi_library() -> str | None:
    """The MPI library mpi4py loads (asked in a child process), None if mpi4py cannot load one."""
    found = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                           capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        print(f"!!! mpi4py unusable: {' '.join(found.stderr.strip().splitlines()[-1:])}")
        return None
    return (found.stdout.strip().splitlines() or ["unknown MPI"])[0]


def mpi_launchers() -> list[tuple[list[str], dict]]:
    """Launcher commands for 2 ranks (with flags and environment), those beside python first."""
    beside = Path(sys.executable).parent
    candidates = [beside / "mpiexec", beside / "mpirun", shutil.which("mpirun"), shutil.which("mpiexec")]
    found, launchers = set(), []
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK) or Path(candidate).resolve() in found:
            continue
        found.add(Path(candidate).resolve())
        version = subprocess.run([str(candidate), "--version"], capture_output=True, text=True, timeout=60)
        if any(name in version.stdout + version.stderr for name in ("Open MPI", "OpenRTE", "PRRTE")):
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                   "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
            flags = ["--oversubscribe", "--bind-to", "none", "-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED"]
            launchers.append(([str(candidate), "-np", "2", *flags], env))
        else:
            launchers.append(([str(candidate), "-n", "2"], {}))
    return launchers


def run_mpi(args, results: Path, batch: int, timeout: float, info: dict) -> dict:
    """2 ranks through the first launcher that works (one that fails at once is skipped); a
    singleton (1 rank) where there is none, which runs the MPI code path but is no comparison."""
    library = info["mpi_library"] = mpi_library()
    launchers = mpi_launchers() if library else []
    bench = lambda devices: [sys.executable, "-m", "mpi4py", "-m", "ucudnn",  # noqa: E731
                             *bench_command(args, batch, results / "mpi.db", devices, "--mpi")[3:]]
    result, deadline = {"rc": "not run"}, time.monotonic() + timeout
    for attempt, (launcher, env) in enumerate(launchers):
        info["mpi_launcher"], info["mpi_ranks"] = launcher[0], 2
        result = run(results, f"mpi-{attempt}" if attempt else "mpi", launcher + bench("0,1"),
                     deadline - time.monotonic(), env)
        if result["rc"] == 0 or result["wall_s"] > 60:
            return result
        (results / "mpi.db").unlink(missing_ok=True)
    if library and not launchers:
        print("!!! no mpirun or mpiexec (command -v mpirun failed): running the MPI path as a singleton, "
              "1 rank on GPU 0, instead of 2 ranks")
        info["mpi_launcher"], info["mpi_ranks"] = "none (singleton)", 1
        return run(results, "mpi-singleton", bench("0"), timeout)
    return result


# ---- comparing the databases


def keys(path: Path) -> dict[tuple, str]:
    """(gpu, cuDNN, shape key, micro-batch, backend, candidate) -> status of every measurement."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT gpu_name, cudnn_version, shape_key, batch, backend, algo, status FROM measurements")
        return {tuple(row[:6]): row[6] for row in rows}


def compare(paths: dict[str, Path]) -> dict:
    found = {name: keys(path) for name, path in paths.items() if path.is_file()}
    if "one" not in found:
        return {"error": "no 1-GPU database to compare with"}
    reference, report = found["one"], {"measurements": {n: len(k) for n, k in found.items()}}
    for name, other in found.items():
        if name == "one":
            continue
        differ = sorted(k for k in set(reference) & set(other) if reference[k] != other[k])
        report[f"one_vs_{name}"] = {
            "same_keys": set(reference) == set(other), "only_in_one": len(set(reference) - set(other)),
            f"only_in_{name}": len(set(other) - set(reference)), "same_statuses": not differ,
            "status_differences": [f"{k[2]} b={k[3]} {k[4]}:{k[5]}: {reference[k]} vs {other[k]}" for k in differ[:10]]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--budget", type=float, default=530.0, help="seconds for everything (default 530)")
    parser.add_argument("--net", default="alexnet")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--policy", default="all")
    parser.add_argument("--timing", default="quick", choices=("quick", "default"))
    parser.add_argument("--backend", default="", choices=("", "all", "engines", "legacy"))
    parser.add_argument("--no-tests", action="store_true", help="skip tests/test_gpu_parallel.py")
    args = parser.parse_args()
    results = args.results
    results.mkdir(parents=True, exist_ok=True)
    for old in results.glob("*.db"):
        old.unlink()
    info: dict = {"net": args.net, "policy": args.policy, "timing": args.timing, "budget_s": args.budget}
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:
        gpus = []
    info["gpus"] = gpus
    print("\n".join(gpus))
    if len(gpus) < 2:
        print("!!! fewer than 2 GPUs: the 2-GPU runs will fail")
    batch = info["batch"] = choose_batch(args, results, info)
    limit = lambda share: max(args.budget - elapsed() - RESERVE_S * share, 30)  # noqa: E731
    runs = info["runs"] = {}
    runs["one"] = run(results, "one", bench_command(args, batch, results / "one.db", "0"), limit(1.5))
    runs["two"] = run(results, "two", bench_command(args, batch, results / "two.db", "0,1"), limit(1.2))
    runs["mpi"] = run_mpi(args, results, batch, limit(1.0), info)
    ok = [runs[n]["rc"] == 0 for n in ("one", "two")]
    if all(ok):
        info["speedup_wall"] = round(runs["one"]["wall_s"] / runs["two"]["wall_s"], 3)
        if runs["one"].get("bench_s") and runs["two"].get("bench_s"):
            info["speedup_in_bench"] = round(runs["one"]["bench_s"] / runs["two"]["bench_s"], 3)
        info["speedup_at_least_1_7"] = info["speedup_wall"] >= SPEEDUP_WANTED
    info["compare"] = compare({"one": results / "one.db", "two": results / "two.db", "mpi": results / "mpi.db"})
    if not args.no_tests and args.budget - elapsed() > 30:
        test = run(results, "test_gpu_parallel", [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs",
                                                   "tests/test_gpu_parallel.py"], args.budget - elapsed() - 5)
        info["gpu_test"] = test["rc"]
    info["total_s"] = round(elapsed(), 1)
    (results / "summary.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0 if all(ok) and runs["mpi"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
