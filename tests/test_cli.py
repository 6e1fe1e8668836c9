"""The `ucudnn` command end to end, as users run it: `python -m ucudnn ...` in a subprocess, on a
database of synthetic measurements (and on the shipped recordings where they exist)."""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ucudnn.cli import main
from ucudnn.core import errors
from ucudnn.core.nets import get_network, list_networks
from ucudnn.measure.cache import BenchmarkDatabase, recorded_path

import synthetic
from fakes import FOREIGN_TABLES, checksums, damage_middle, make_foreign, overwrite_root, spoil

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def environment(env_extra: dict | None = None) -> dict:
    """This process's environment for `python -m ucudnn`: this checkout's, no UCUDNN_* variable but
    UCUDNN_PROGRESS=0 and `env_extra`'s. The progress line, which a command writes once it has
    taken seconds, would make stderr depend on the machine's speed (test_*_reports_its_progress show it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCUDNN_")} | {"UCUDNN_PROGRESS": "0"}
    env |= env_extra or {}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run(*args: str, cwd: Path | None = None, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ucudnn", *args], capture_output=True, text=True,
                          env=environment(env_extra), cwd=cwd, timeout=120)


def ok(*args: str) -> str:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """AlexNet at batch 256 (fp32 NCHW and fp16 NHWC) and ResNet-18 at batch 32, powerOfTwo, on a
    synthetic GPU."""
    path = tmp_path_factory.mktemp("cache") / "synthetic.db"
    with BenchmarkDatabase(path) as database:
        synthetic.record_network(database, get_network("alexnet").problems(256))
        synthetic.record_network(database, get_network("alexnet").problems(256, "float16", layout="nhwc"))
        synthetic.record_network(database, get_network("resnet18").problems(32))
    return str(path)


def optimize(db: str, *args: str) -> dict:
    return json.loads(ok("optimize", "--offline", "--cache", db, "--json", *args))


# ---- optimize


def test_optimize_prints_the_plan_and_the_speedup(db):
    out = ok("optimize", "--offline", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB", "--cache", db)
    assert "Synthetic GPU (sm 9.0), cuDNN 9.1.0" in out
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"conv\d/(F|BD|BF) ", line)}
    assert len(rows) == 15 and "FFT" in rows["conv2/BD"]
    speedup = re.search(r"speedup over cuDNN undivided at 64.0 MiB per kernel: ([\d.]+)x", out)
    assert speedup and float(speedup.group(1)) > 1
    assert re.search(r"unlimited best .*: [\d.]+ ms", out)


def test_optimize_json_is_complete_and_consistent(db):
    plan = optimize(db, "--net", "alexnet", "--workspace", "64MiB")
    assert plan["device"]["gpu_name"] == "Synthetic GPU" and plan["measured"] is False
    assert (plan["network"], plan["batch"], plan["optimizer"], plan["policy"]) == ("alexnet", 256, "wr", "powerOfTwo")
    assert len(plan["kernels"]) == 15
    for kernel in plan["kernels"]:
        for which in ("configuration", "undivided", "best"):
            assert sum(part["batch"] for part in kernel[which]["micro"]) == 256
        assert kernel["configuration"]["workspace"] <= 64 * MIB
        assert [p["batch"] for p in kernel["undivided"]["micro"]] == [256]
    total = plan["total"]
    assert total["time_ms"] == pytest.approx(sum(k["count"] * k["configuration"]["time_ms"] for k in plan["kernels"]))
    assert total["speedup"] == pytest.approx(total["undivided_time_ms"] / total["time_ms"])
    assert total["gap_to_best"] == pytest.approx(total["time_ms"] / total["best_time_ms"])


def test_optimize_plans_half_types_with_tensor_op_math(db):
    """Half types default to tensor-op math (cuDNN's tensor-core kernels need it); the math is
    part of every kernel's key, so fp16 measurements taken with another math are not used."""
    plan = optimize(db, "--net", "alexnet", "--dtype", "float16", "--layout", "nhwc")
    assert plan["math"] == "tensor_op" and len(plan["kernels"]) == 15
    assert optimize(db, "--net", "alexnet")["math"] == "default"
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--dtype", "float16",
                 "--layout", "nhwc", "--math", "default")
    assert result.returncode == 2 and "math=default" in result.stderr


def test_optimize_wd_keeps_to_the_total(db):
    plan = optimize(db, "--net", "resnet18", "--batch", "32", "--total-workspace", "100MiB")
    assert (plan["optimizer"], plan["limit"]) == ("wd", 100 * MIB)
    assert plan["total"]["workspace"] <= 100 * MIB
    assert plan["solver"]["variables"] > 0


def test_a_total_workspace_means_wd_even_zero_or_from_the_environment(db):
    plan = optimize(db, "--net", "alexnet", "--total-workspace", "0")
    assert (plan["optimizer"], plan["limit"], plan["total"]["workspace"]) == ("wd", 0, 0)
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--json",
                 env_extra={"UCUDNN_TOTAL_LIMIT": "100MiB"})
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["optimizer"], json.loads(result.stdout)["limit"]) == ("wd", 100 * MIB)


@pytest.mark.parametrize("flags, planned", [(("--workspace", "1MiB"), ("wr", MIB)),
                                            (("--optimizer", "wr"), ("wr", 64 * MIB)),
                                            (("--optimizer", "wd"), ("wd", 120 * MIB))])
def test_a_flag_wins_over_the_environment_it_contradicts(db, flags, planned):
    """UCUDNN_TOTAL_LIMIT (WD's total) beside --workspace planned WD at the variable's total, the
    flag ignored; beside --optimizer wr it failed in the API's words. The flag wins."""
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--json", *flags,
                 env_extra={"UCUDNN_TOTAL_LIMIT": "120MiB"})
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["optimizer"], json.loads(result.stdout)["limit"]) == planned


def test_the_solver_flag_picks_wds_ilp_solver(db):
    plan = optimize(db, "--net", "alexnet", "--optimizer", "wd", "--solver", "highs")
    assert plan["solver"]["solver"] == "highs"
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--optimizer", "wd", "--json",
                 env_extra={"UCUDNN_SOLVER": "HiGHS"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["solver"]["solver"] == "highs"


def test_paper_takes_the_solver_flag_too():
    from ucudnn.cli import build_parser

    assert build_parser().parse_args(["paper", "13", "--solver", "highs"]).solver == "highs"


@pytest.fixture
def pulp_4_without_cbc(monkeypatch):
    """PuLP 4 without its cbc extra, on a machine with no cbc of its own (see test_wd.py's)."""
    import pulp

    monkeypatch.setattr(pulp.COIN_CMD, "available", lambda self: False)
    monkeypatch.delattr(pulp, "PULP_CBC_CMD")


def test_without_a_cbc_binary_optimize_solves_with_highs(capsys, db, pulp_4_without_cbc):
    status, out, err = inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet", "--optimizer", "wd")
    assert status == 0, err
    assert re.search(r"WD: \d+ binary variables, built in [\d.]+ s, solved by highs in", out)
    status, _, err = inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet", "--solver", "cbc",
                            "--optimizer", "wd")
    assert status == 2 and err.count("\n") == 1 and "'cbc' is not installed" in err and "installed: highs" in err


def test_with_no_solver_installed_optimize_wd_says_how_to_install_one(capsys, db, pulp_4_without_cbc, monkeypatch):
    import pulp

    for solver in (pulp.HiGHS, pulp.GLPK_CMD):
        monkeypatch.setattr(solver, "available", lambda self: False)
    status, _, err = inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet", "--optimizer", "wd")
    assert status == 2 and err.count("\n") == 1 and "no ILP solver for WD is installed" in err
    status, _, err = inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet")
    assert status == 0, err  # WR needs no ILP solver


@pytest.mark.parametrize("variable", ["UCUDNN_WORKSPACE_LIMIT", "UCUDNN_TOTAL_LIMIT"])
def test_a_limit_of_auto_plans_at_the_default_and_says_so(db, variable):
    """auto, ucudnn.torch's limit from the memory timeline of a training step, failed as "'auto' is
    not a size": offline there is no timeline, so the command says so in a line and plans at the default."""
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--json", env_extra={variable: "auto"})
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["optimizer"], json.loads(result.stdout)["limit"]) == ("wr", 64 * MIB)
    assert result.stderr.count("\n") == 1 and f"{variable}=auto" in result.stderr and "64.0 MiB" in result.stderr
    flagged = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--json", "--workspace", "8MiB",
                  env_extra={variable: "auto"})
    assert flagged.returncode == 0 and flagged.stderr == "" and json.loads(flagged.stdout)["limit"] == 8 * MIB


def test_paper_reads_a_limit_of_auto_as_unset(capsys, monkeypatch, tmp_path):
    """The paper's figures plan at the paper's limits, whatever the variables say."""
    monkeypatch.setenv("UCUDNN_WORKSPACE_LIMIT", "auto")
    assert main(["paper", "9", "--out", str(tmp_path)]) == 0
    assert "not a size" not in capsys.readouterr().err


@pytest.fixture
def progress_at_once(monkeypatch):
    """The progress line from the first step on, at every step (it waits AFTER_S seconds, and
    writes a log a line every LOG_EVERY_S)."""
    from ucudnn.core import progress

    monkeypatch.setattr(progress, "AFTER_S", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)


def test_paper_reports_its_progress(capsys, tmp_path, progress_at_once):
    assert main(["paper", "9", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("ucudnn: planning, ") and "Fig. 9" in line for line in lines), lines
    assert lines[-1].startswith("ucudnn: planned in ") and lines[-1].endswith(": 1 figure"), lines


def test_optimize_reports_its_progress(capsys, db, progress_at_once, monkeypatch):
    status, _, err = inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet")
    lines = err.splitlines()
    assert status == 0 and any(line.startswith("ucudnn: planning, ") and "alexnet" in line for line in lines), lines
    assert lines[-1].startswith("ucudnn: planned in "), lines
    monkeypatch.setenv("UCUDNN_PROGRESS", "0")
    assert inline(capsys, "optimize", "--offline", "--cache", db, "--net", "alexnet")[2] == ""


def test_variables_that_contradict_each_other_are_named(db):
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet",
                 env_extra={"UCUDNN_TOTAL_LIMIT": "120MiB", "UCUDNN_OPTIMIZER": "wr"})
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert ("UCUDNN_TOTAL_LIMIT='120MiB' is the WD optimizer's limit, but UCUDNN_OPTIMIZER='wr' plans each kernel "
            "alone" in result.stderr)


@pytest.mark.parametrize("name, message", [("plan.txt", "extension .txt is not a plot format; end it in .png"),
                                           ("plan", "has no extension; end it in .png")])
def test_a_plot_file_matplotlib_cannot_write_is_refused_before_planning(tmp_path, name, message):
    pytest.importorskip("matplotlib")
    path = tmp_path / name
    # the cache does not exist: the plot file is checked first, before anything is read or planned
    result = run("optimize", "--net", "alexnet", "--cache", str(tmp_path / "none.db"), "--plot", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    assert str(path) in result.stderr and list(tmp_path.iterdir()) == []


def test_the_division_bar_counts_each_distinct_kernel_once():
    """WD divides one workspace among distinct kernels: repeated ones share theirs, so the bar's
    height is the plan's workspace, within the total."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from ucudnn.reports.plots import draw_division

    from test_report import report

    kernels = get_network("resnet50").problems(32)
    assert any(k.count > 1 for k in kernels)
    tables = {k.problem.key: synthetic.table(k.problem) for k in kernels}
    plan = report(kernels, tables, total_limit="200MiB")
    ax = Figure().subplots()
    draw_division(ax, plan)
    heights = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0) + patch.get_height()
    assert heights[1] == pytest.approx(plan.workspace / MIB, rel=1e-3) and heights[1] <= 200


def test_optimize_plots_wr_and_wd(db, tmp_path):
    for args in (("--kernel", "conv2/F"), ("--optimizer", "wd")):
        path = tmp_path / f"plan{args[0]}.png"
        out = ok("optimize", "--offline", "--net", "alexnet", "--cache", db, "--plot", str(path), *args)
        assert f"plot: {path}" in out
        assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 10_000


def test_division_bar_is_labelled_cudnn_undivided():
    """The left bar of the WD division is the cuDNN-undivided reference at the per-kernel limit."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from ucudnn.reports.plots import draw_division

    from test_report import report

    kernels = get_network("alexnet").problems(32)
    tables = {k.problem.key: synthetic.table(k.problem) for k in kernels}
    plan = report(kernels, tables, total_limit="150MiB", optimizer="wd")
    ax = Figure().subplots()
    draw_division(ax, plan)
    labels = [label.get_text() for label in ax.get_xticklabels()]
    assert labels == [f"cuDNN undivided\n{plan.kernel_limit / MIB:.1f} MiB each", "WD\n150 MiB total"]


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
def test_optimize_on_the_shipped_recordings():
    out = ok("optimize", "--offline", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB")
    assert re.search(r"speedup over cuDNN undivided at 64.0 MiB per kernel: [\d.]+x", out)
    assert str(recorded_path()) in out


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
def test_the_shipped_recordings_serve_both_executions():
    plans = {execution: json.loads(ok("optimize", "--offline", "--net", "alexnet", "--batch", "256",
                                      "--execution", execution, "--json"))
             for execution in ("graph", "direct")}
    for execution, plan in plans.items():
        assert plan["device"]["execution"] == execution
    # the same kernels timed two ways (host time shows only in direct calls), so close, not equal
    graph, direct = plans["graph"]["total"]["time_ms"], plans["direct"]["total"]["time_ms"]
    assert graph != direct and abs(graph / direct - 1) < 0.2


def test_a_database_without_the_execution_names_the_fix(db):
    result = run("optimize", "--offline", "--cache", db, "--net", "alexnet", "--execution", "direct")
    assert result.returncode == 2
    assert "no measurements timed for direct execution" in result.stderr
    assert "pass --execution graph" in result.stderr


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
@pytest.mark.parametrize("optimizer,limit,dtype,layout", [
    ("wr", "64MiB", "float32", "nchw"), ("wr", "64MiB", "float16", "nhwc"),
    ("wd", "256MiB", "float32", "nchw"), ("wd", "128MiB", "float16", "nhwc")])
def test_shipped_plans_stage_the_parts_that_start_off_the_alignment(optimizer, limit, dtype, layout):
    """Every micro-batch that starts off the slice alignment carries its staged slices in its
    workspace; Caffe AlexNet's conv1 (3x227x227 samples) splits where it is faster."""
    from ucudnn.core.problem import ConvProblem
    from ucudnn.core.staging import slices_of

    plan = json.loads(ok("optimize", "--offline", "--net", "alexnet", "--batch", "256", "--optimizer", optimizer,
                         "--workspace" if optimizer == "wr" else "--total-workspace", limit,
                         "--dtype", dtype, "--layout", layout, "--json"))
    staged_parts = 0
    for kernel in plan["kernels"]:
        problem = ConvProblem.from_dict(kernel["problem"])
        start = 0
        for part in kernel["configuration"]["micro"]:
            staged = slices_of(problem).staged(start)
            staged_parts += bool(staged)
            assert part["workspace"] >= slices_of(problem).extra(staged, part["batch"])[1], (kernel["name"], start)
            start += part["batch"]
    conv1 = {k["name"]: k for k in plan["kernels"]}["conv1/BD"]["configuration"]["micro"]
    assert len(conv1) > 1 and staged_parts > 0, "conv1/BD is divided, through staged parts"


def test_caffe_alexnet_fp16_at_64mib_is_planned_near_its_unlimited_time():
    """Caffe AlexNet fp16: under the old 256-byte slice rule conv1/BD stayed undivided on a slow
    plan (432.06 ms predicted); staging lets it split (docs/results.md)."""
    plan = json.loads(ok("optimize", "--offline", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB",
                         "--dtype", "float16", "--layout", "nhwc", "--json"))
    assert plan["total"]["time_ms"] < 10.0 < plan["total"]["undivided_time_ms"], plan["total"]


# ---- nets and cache


def test_nets_lists_and_shows_networks(capsys, tmp_path):
    listing = json.loads(ok("nets", "--json"))
    assert {n["name"] for n in listing} == {"alexnet", "resnet18", "resnet50", "densenet40", "googlenet", "c3d",
                                            "unet3d", "wav2vec"}
    assert "googlenet" in inline(capsys, "nets")[1]
    out = ok("nets", "resnet50")
    assert re.search(r"layer3\.1\.conv2\s+5\s+256\s+256\s+3x3", out)
    network_file = tmp_path / "mine.json"
    network_file.write_text(inline(capsys, "nets", "alexnet", "--json")[1])
    assert inline(capsys, "nets", str(network_file))[1] == inline(capsys, "nets", "alexnet")[1]


def test_a_network_file_plans_like_its_builtin(capsys, db, tmp_path):
    network_file = tmp_path / "alexnet-copy.json"
    network_file.write_text(inline(capsys, "nets", "alexnet", "--json")[1])
    total = lambda net: json.loads(inline(capsys, "optimize", "--offline", "--cache", db, "--json",  # noqa: E731
                                          "--net", net)[1])["total"]
    assert total(str(network_file)) == total("alexnet")


def test_cache_list_show_verify(capsys, db):
    listing = json.loads(ok("cache", "list", "--cache", db, "--json"))
    (device,) = listing["devices"]
    assert device["gpu_name"] == "Synthetic GPU" and len(device["kernels"]) == 15 + 15 + 33
    assert "Synthetic GPU" in inline(capsys, "cache", "list", "--cache", db)[1]
    show = ("cache", "show", "--net", "alexnet", "--kernel", "conv2/F", "--cache", db)
    assert re.search(r"256\s+legacy:FFT\s+ok", ok(*show))
    shown = json.loads(inline(capsys, *show, "--json")[1])
    assert {m["batch"] for m in shown["devices"][0]["measurements"]} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert "no problems" in ok("cache", "verify", "--cache", db)


def test_cache_export_import_merge(db, tmp_path):
    exported = tmp_path / "export.json"
    assert "exported" in ok("cache", "export", str(exported), "--cache", db)
    copy = tmp_path / "copy.db"
    ok("cache", "import", str(exported), "--cache", str(copy))
    merged = tmp_path / "merged.db"
    out = ok("cache", "merge", str(copy), db, "--into", str(merged))
    count = int(re.search(r"merged (\d+) measurements", out).group(1))
    with BenchmarkDatabase(db, readonly=True) as original, BenchmarkDatabase(merged, readonly=True) as result:
        assert count == 2 * sum(n for _, n in original.kernels())
        assert result.kernels() == original.kernels()


# ---- bad input: one line naming the value and the fix, exit status 2, no traceback


def inline(capsys, *argv: str) -> tuple[int, str, str]:
    """main() in this process, the fast way to check errors: exit status, stdout, stderr."""
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("argv, message", [
    (("optimize", "--net", "nosuchnet"), "unknown network 'nosuchnet'; use one of alexnet"),
    (("optimize", "--net", "alexnet", "--workspace", "64XB"), "size='64XB' is not a size; use"),
    (("optimize", "--net", "alexnet", "--batch", "-3"), "'-3' is not an integer from 1 to 2**63 - 1"),
    (("optimize", "--net", "alexnet", "--policy", "most"),
     "argument --policy: 'most' is unknown; use one of all, powerOfTwo, undivided"),
    (("optimize", "--net", "alexnet", "--optimizer", "ILP"), "argument --optimizer: 'ILP' is unknown; use one of wr, wd"),
    (("optimize", "--net", "alexnet", "--kernel", "conv2/F"), "--kernel picks the kernel --plot draws; add --plot"),
    (("optimize", "--net", "alexnet", "--workspace", "8MiB", "--total-workspace", "100MiB"),
     "--workspace is not used beside --total-workspace"),
    (("optimize", "--net", "alexnet", "--workspace", "99999999999999999999999TiB"), "is more than int64 holds"),
    (("optimize", "--net", "alexnet", "--batch", "99999999999999999999"), "is not an integer from 1 to 2**63 - 1"),
    (("optimize", "--net", "alexnet", "--plot", "/nonexistent/plan.png"), "folder /nonexistent does not exist"),
    (("cache", "export", "/nonexistent/out.json"), "folder /nonexistent does not exist"),
    (("cache", "export", str(REPO / "docs")), f"{REPO / 'docs'} is a folder; give a file name such as "
                                             f"{REPO / 'docs' / 'out.json'}"),
    (("cache", "merge", "a.db", "--into", str(REPO / "docs")), f"such as {REPO / 'docs' / 'benchmarks.db'}"),
    (("optimize", "--net", "alexnet", "--cache", "/nonexistent/x.db"), "no benchmark database at /nonexistent/x.db"),
    (("optimize", "--net", "alexnet", "--optimizer", "wr", "--total-workspace", "1GiB"), "use --optimizer wd"),
    (("nets", "/nonexistent/net.json"), "network file /nonexistent/net.json does not exist"),
    (("optimize", "--net", "alexnet", "--total-workspace", "0", "--optimizer", "wr"), "use --optimizer wd"),
    (("optimize", "--net", "alexnet", "--workspace", "-1MiB"), "size='-1MiB' is negative; sizes are >= 0"),
    (("optimize", "--net", "alexnet", "--total-workspace", "-5"), "size='-5' is negative; sizes are >= 0"),
])
def test_bad_input_gets_one_line(capsys, argv, message):
    status, _, err = inline(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("ucudnn") and message in err


BAD_LAYER = {"name": "c1", "in_channels": 3, "out_channels": 8, "kernel": 3, "input_size": 32}


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe", "is not UTF-8 text (byte 0xff at offset 0); save it as UTF-8 JSON"),
    (json.dumps({"layers": [{**BAD_LAYER, "in_channels": "three"}]}).encode(),
     "layer c1: in_channels='three' must be an integer from 1 to 2**63 - 1"),
    (json.dumps({"layers": [{**BAD_LAYER, "input_size": 32.5}]}).encode(),
     "layer c1: input_size=32.5 must be an integer or 2 integers [height, width]"),
    (json.dumps({"layers": [{**BAD_LAYER, "stride": None}]}).encode(),
     "layer c1: stride=None must be an integer or 2 integers [height, width]"),
    (json.dumps({"layers": [BAD_LAYER], "default_batch": 0}).encode(), "default_batch=0 must be an integer from 1"),
    (json.dumps({"layers": [{**BAD_LAYER, "stride": 0}]}).encode(), "layer c1: stride=0 must be"),
    (json.dumps({"layers": [{**BAD_LAYER, "stride": [1, 2, 3, 4]}]}).encode(),
     "layer c1: stride=[1, 2, 3, 4] has 4 values; a size is an integer or a list of 1, 2 or 3"),
    (json.dumps({"layers": [{**BAD_LAYER, "dilation": [1, 0]}]}).encode(), "layer c1: dilation=[1, 0] must be"),
    (json.dumps({"layers": [{**BAD_LAYER, "kernel": 0}]}).encode(), "layer c1: kernel=0 must be"),
    (json.dumps({"layers": [{**BAD_LAYER, "pad": -1}]}).encode(), "layer c1: pad=-1 must be"),
    (json.dumps({"layers": [{**BAD_LAYER, "input_size": 0}]}).encode(), "layer c1: input_size=0 must be"),
    (json.dumps({"layers": [{k: v for k, v in BAD_LAYER.items() if k != "kernel"}]}).encode(),
     "layer c1 lacks kernel; a layer has the keys"),
    (json.dumps({"layers": [{**BAD_LAYER, "strides": 2}]}).encode(), "layer c1 has an unknown key strides; a layer"),
    (json.dumps({"layers": [{**BAD_LAYER, "in_channels": 10**20}]}).encode(),
     "layer c1: in_channels=100000000000000000000 must be an integer from 1 to 2**63 - 1"),
    (json.dumps({"layers": [{**BAD_LAYER, "in_channels": 1e20}]}).encode(),
     "layer c1: in_channels=1e+20 must be an integer from 1 to 2**63 - 1"),
])
@pytest.mark.slow
def test_a_bad_network_file_names_the_file_layer_field_and_value(tmp_path, content, message):
    path = tmp_path / "b.json"
    path.write_bytes(content)
    result = run("nets", str(path))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and f"network file {path}" in result.stderr and message in result.stderr
    assert path.read_bytes() == content
    assert "ConvProblem(" not in result.stderr and "must be positive" not in result.stderr


def test_a_network_file_with_a_byte_order_mark_reads_as_without(capsys, tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"name": "bom", "layers": [BAD_LAYER]}).encode())
    status, out, err = inline(capsys, "nets", str(path))
    assert status == 0 and out.startswith("bom: ") and err == ""


def test_missing_measurements_with_no_gpu(capsys, db):
    # measurements are shared by batch sizes: 512 needs the one size that is missing
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--batch", "512", "--cache", db)
    assert status == 2 and err.count("\n") == 1
    assert "has no measurements for alexnet at batch 512" in err
    assert "any batch up to 256 float32 nchw (all)" not in err  # synthetic: powerOfTwo
    assert ("it has legacy: alexnet batch 256 float16 nhwc (powerOfTwo), alexnet batch 256 float32 nchw "
            "(powerOfTwo); engines: none;") in err
    assert "`ucudnn bench --net alexnet --batch 512` on a GPU" in err  # both backends lack it: no --backend


def test_missing_measurements_name_the_math_and_the_flags_that_measure_them(capsys, db):
    """The file has alexnet float32 nchw with default math: a plan with fma math lacks them, and
    says so with the math it asked for, beside what the file has."""
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--math", "fma", "--cache", db)
    assert status == 2 and err.count("\n") == 1
    assert "has no measurements for alexnet at batch 256 float32 nchw math fma (powerOfTwo)" in err
    assert "`ucudnn bench --net alexnet --batch 256 --math fma` on a GPU" in err


@pytest.mark.parametrize("flags, asked, bench", [
    (("--dtype", "bfloat16"), "alexnet conv2/F at batch 256 bfloat16 nchw", "--batch 256 --dtype bfloat16"),
    (("--math", "fma"), "alexnet conv2/F at batch 256 float32 nchw math fma", "--batch 256 --math fma"),
])
def test_cache_show_of_a_kernel_not_measured_names_its_type_and_the_bench_flags(capsys, db, flags, asked, bench):
    status, _, err = inline(capsys, "cache", "show", "--net", "alexnet", "--kernel", "conv2/F", *flags, "--cache", db)
    assert status == 2 and err.count("\n") == 1
    assert f"has no measurements of {asked}" in err and f"`ucudnn bench --net alexnet {bench}` on a GPU" in err


def test_a_missing_backend_is_named_and_measured_alone(capsys, db):
    """The synthetic file holds legacy measurements only: planning from the engines' candidates
    names the backend that has them and the one that lacks them, and benches only that one."""
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--backend", "engines",
                            "--cache", db)
    assert status == 2 and err.count("\n") == 1
    assert "it has legacy: alexnet batch 256 float16 nhwc (powerOfTwo), alexnet batch 256 float32 nchw " in err
    assert "; engines: none;" in err
    assert "`ucudnn bench --net alexnet --batch 256 --backend engines` on a GPU" in err


def test_cache_list_names_what_each_backend_covers(db):
    out = ok("cache", "list", "--cache", db)
    assert ("by backend: legacy: alexnet batch 256 float16 nhwc (powerOfTwo), alexnet batch 256 float32 nchw "
            "(powerOfTwo), resnet18 batch 32 float32 nchw (powerOfTwo); engines: none") in out
    device = json.loads(ok("cache", "list", "--cache", db, "--json"))["devices"][0]
    assert device["recordings_by_backend"]["engines"] == []
    assert device["recordings_by_backend"]["legacy"] == device["recordings"]


def test_a_huge_batch_names_its_missing_sizes_in_brief(capsys, db):
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--batch", "100000",
                            "--policy", "all", "--cache", db)
    assert status == 2 and err.count("\n") == 1 and len(err) < 1500
    assert re.search(r"at 99\d\d\d micro-batch sizes from 3 to 100000 \(3, 5, 6, 7, [\d, ]+\.\.\.\)", err)
    assert "`ucudnn bench --net alexnet --batch 100000 --policy all`" in err


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
@pytest.mark.parametrize("variant", [("float32", "nchw"), ("float16", "nhwc")])
@pytest.mark.parametrize("net", [n.name for n in list_networks()])
@pytest.mark.slow
def test_every_builtin_network_plans_offline_at_its_documented_batch(capsys, net, variant):
    """Every built-in network plans offline at its documented batch size from the shipped file."""
    dtype, layout = variant
    status, out, err = inline(capsys, "optimize", "--offline", "--net", net, "--dtype", dtype, "--layout", layout,
                              "--json")
    assert status == 0, err
    plan = json.loads(out)
    assert plan["batch"] == get_network(net).default_batch
    assert re.search(rf"^{net}\s+{plan['batch']}\s", inline(capsys, "nets")[1], re.M)  # `ucudnn nets` says so


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
@pytest.mark.slow
def test_the_shipped_recordings_say_what_they_cover():
    from ucudnn.reports.coverage import recordings

    with BenchmarkDatabase(recorded_path(), readonly=True) as database:
        device = next(d for d in database.devices() if d.execution == "graph")
        covered = {(r.network, r.dtype, r.layout): r for r in recordings(database, device)}
    assert covered["alexnet", "float32", "nchw"].describe() == "alexnet any batch up to 256 float32 nchw (all)"
    assert covered["resnet50", "float16", "nhwc"].batch == 64
    assert covered["resnet18", "float32", "nchw"].covers(128, "powerOfTwo")
    assert not covered["resnet18", "float32", "nchw"].covers(100, "powerOfTwo")
    listing = json.loads(ok("cache", "list", "--json"))
    assert {"network": "alexnet", "batch": 256, "dtype": "float32", "layout": "nchw", "math": "default",
            "policy": "all"} in listing["devices"][0]["recordings"]


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
def test_a_batch_the_shipped_file_lacks_names_what_it_has_and_the_command(capsys):
    status, _, err = inline(capsys, "optimize", "--net", "resnet50", "--batch", "256")
    assert status == 2 and err.count("\n") == 1
    assert "it has legacy: resnet50 batch 64 float16 nhwc (powerOfTwo), resnet50 batch 64 float32 nchw" in err
    assert ("; engines: resnet50 batch 64 float16 nhwc (powerOfTwo), resnet50 batch 64 float32 nchw (powerOfTwo);"
            in err)
    assert "`ucudnn bench --net resnet50 --batch 256` on a GPU" in err


def test_plot_kernel_must_exist(capsys, db, tmp_path):
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--cache", db,
                         "--plot", str(tmp_path / "x.png"), "--kernel", "conv9/F")
    assert status == 2 and "kernel 'conv9/F' is not in this network" in err


@pytest.mark.parametrize("command", ["optimize", "nets"])
def test_a_reader_closing_the_pipe_early_is_not_an_error(db, command):
    """`ucudnn ... | head -c 100`: the reader is gone before ucudnn writes; it stops quietly with 141.
    optimize --json writes 38 kB (the pipe breaks in print), nets less than the 8 kB buffer (in
    the last flush)."""
    argv = ["optimize", "--offline", "--net", "alexnet", "--json", "--cache", db] if command == "optimize" else ["nets"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCUDNN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    process = subprocess.Popen([sys.executable, "-m", "ucudnn", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    process.stdout.close()  # before it writes: every write then fails with EPIPE, not only some
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and err == b""


def test_a_kernel_without_a_plot_is_an_error(capsys, db):
    status, out, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--cache", db, "--kernel", "conv9/F")
    assert status == 2 and out == "" and err.count("\n") == 1 and "add --plot FILE.png or drop --kernel" in err


@pytest.mark.parametrize("policy", ["poweroftwo", "POWEROFTWO", "powerOfTwo"])
def test_the_policy_reads_alike_from_the_flag_and_the_variable(db, policy):
    by_flag = run("optimize", "--offline", "--net", "alexnet", "--cache", db, "--json", "--policy", policy)
    by_variable = run("optimize", "--offline", "--net", "alexnet", "--cache", db, "--json",
                      env_extra={"UCUDNN_POLICY": policy})
    assert by_flag.returncode == by_variable.returncode == 0, (by_flag.stderr, by_variable.stderr)
    assert json.loads(by_flag.stdout)["policy"] == json.loads(by_variable.stdout)["policy"] == "powerOfTwo"


def test_errors_in_a_subprocess_have_no_traceback(db):
    result = run("optimize", "--net", "alexnet", "--workspace", "lots", "--cache", db)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ---- damaged, read-only and missing files: one line naming the file, exit 2, nothing changed


@pytest.fixture
def damaged(db, tmp_path) -> Path:
    path = tmp_path / "damaged.db"
    path.write_bytes(Path(db).read_bytes())
    damage_middle(path)
    return path


def one_line_naming(err: str, *words: str) -> bool:
    return err.count("\n") == 1 and err.startswith("ucudnn") and all(word in err for word in words)


def test_a_damaged_database_is_one_line_in_every_command(capsys, damaged, tmp_path):
    before = damaged.read_bytes()
    export = tmp_path / "export.json"
    for argv in (("optimize", "--offline", "--net", "alexnet"), ("cache", "list"),
                 ("cache", "show", "--net", "alexnet", "--kernel", "conv2/F"), ("cache", "export", str(export)),
                 ("cache", "merge", str(damaged), "--into", str(tmp_path / "merged.db"))):
        status, out, err = inline(capsys, *argv, *(() if "merge" in argv else ("--cache", str(damaged))))
        assert status == 2 and out == "", argv
        assert one_line_naming(err, str(damaged), "damaged", "ucudnn cache verify"), (argv, err)
    assert damaged.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["damaged.db"]
    result = run("cache", "list", "--cache", str(damaged))  # as users run it: no traceback
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_verify_finds_damage_and_names_the_file_once(capsys, damaged):
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(damaged))
    assert status == 1 and out.startswith(f"{damaged}: integrity:")
    assert all(line.count(str(damaged)) == 1 for line in out.splitlines())
    damaged.write_bytes(bytes(range(256)) * 64)  # too damaged to open: still a problem found
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(damaged))
    assert status == 1 and out == f"{damaged}: integrity: file is not a database\n"


def test_import_into_a_damaged_database_changes_nothing(capsys, db, damaged, tmp_path):
    export = tmp_path / "export.json"
    ok("cache", "export", str(export), "--cache", db)
    before = damaged.read_bytes()
    status, _, err = inline(capsys, "cache", "import", str(export), "--cache", str(damaged))
    assert status == 2 and one_line_naming(err, str(damaged), "damaged")
    assert damaged.read_bytes() == before


def test_import_into_a_read_only_database_says_so(capsys, db, tmp_path, monkeypatch):
    """SQLite opens a write-protected file read-only, and root may write to a 0o444 file: so the
    file is opened as SQLite would open it for anyone else (mode=ro); the chmod test below runs
    as any other user."""
    from ucudnn.measure.cache import database as database_module

    export, target = tmp_path / "export.json", tmp_path / "ro.db"
    ok("cache", "export", str(export), "--cache", db)
    BenchmarkDatabase(target).close()
    before = target.read_bytes()
    real_connect = database_module.connect
    monkeypatch.setattr(database_module, "connect", lambda path, **kw: real_connect(path, **{**kw, "readonly": True}))
    status, _, err = inline(capsys, "cache", "import", str(export), "--cache", str(target))
    assert status == 2 and one_line_naming(err, str(target), "read-only", "writable")
    assert target.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to 0o444 files; the mode=ro test covers it")
def test_import_into_a_chmod_read_only_database(db, tmp_path):
    export, target = tmp_path / "export.json", tmp_path / "ro.db"
    ok("cache", "export", str(export), "--cache", db)
    BenchmarkDatabase(target).close()
    target.chmod(0o444)
    result = run("cache", "import", str(export), "--cache", str(target))
    assert result.returncode == 2 and one_line_naming(result.stderr, str(target))
    assert "Traceback" not in result.stderr


def test_failed_import_and_merge_leave_no_file(capsys, damaged, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    status, _, err = inline(capsys, "cache", "import", str(bad), "--cache", str(tmp_path / "new.db"))
    assert status == 2 and one_line_naming(err, str(bad), "not a ucudnn benchmark export")
    status, _, err = inline(capsys, "cache", "merge", str(damaged), "--into", str(tmp_path / "merged.db"))
    assert status == 2 and not (tmp_path / "new.db").exists() and not (tmp_path / "merged.db").exists()


def test_named_folders_must_exist_for_every_written_file(capsys, db, tmp_path):
    missing, export = tmp_path / "missing", tmp_path / "x.json"
    export.write_text("{}")
    for argv in (("cache", "import", str(export), "--cache", str(missing / "x.db")),
                 ("cache", "merge", db, "--into", str(missing / "x.db")),
                 ("cache", "export", str(missing / "x.json"), "--cache", db)):
        status, _, err = inline(capsys, *argv)
        assert status == 2 and one_line_naming(err, f"folder {missing} does not exist"), (argv, err)
    assert not missing.exists()


def test_bench_needs_a_gpu(capsys):
    from ucudnn.execute.bindings import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present: bench would measure")
    status, _, err = inline(capsys, "bench", "--net", "alexnet")
    assert status == 2 and "none is usable here" in err


@pytest.mark.parametrize("command", [(), ("bench",), ("optimize",), ("cache",), ("cache", "list"),
                                     ("cache", "show"), ("cache", "merge"), ("cache", "export"),
                                     ("cache", "import"), ("cache", "verify"), ("paper",), ("nets",)])
def test_every_command_has_help_with_an_example(capsys, command):
    status, out, _ = inline(capsys, *command, "--help")
    assert status == 0 and "example:\n  ucudnn " in out


@pytest.mark.parametrize("flag, variable", [
    ("--workspace", "UCUDNN_WORKSPACE_LIMIT"), ("--total-workspace", "UCUDNN_TOTAL_LIMIT"),
    ("--policy", "UCUDNN_POLICY"), ("--optimizer", "UCUDNN_OPTIMIZER"), ("--execution", "UCUDNN_EXECUTION"),
    ("--backend", "UCUDNN_BACKEND"), ("--cache", "UCUDNN_CACHE"),
])
def test_the_help_of_a_flag_names_the_variable_that_sets_its_default(capsys, flag, variable):
    from ucudnn.cli import build_parser

    optimize = next(action for action in build_parser()._subparsers._group_actions[0].choices["optimize"]._actions
                    if flag in action.option_strings)
    assert f"${variable}" in optimize.help


@pytest.mark.slow
def test_cache_prune_shrinks_a_file_and_keeps_its_plans(db, tmp_path):
    """The synthetic recording (every candidate at every size, dominated and unsupported ones too)
    pruned: fewer measurements, the same WR and WD plans; pruning again changes nothing."""
    pruned = tmp_path / "pruned.db"
    pruned.write_bytes(Path(db).read_bytes())
    kept, before = map(int, re.search(r"kept (\d+) of (\d+) measurements", ok("cache", "prune", "--cache", str(pruned))).groups())
    assert kept < before
    assert f"kept {kept} of {kept} measurements" in ok("cache", "prune", "--cache", str(pruned))
    volatile = ("database", "build_seconds", "solve_seconds")

    def plan(path, *args):
        def strip(d):
            if isinstance(d, dict):
                return {k: strip(v) for k, v in d.items() if k not in volatile}
            return [strip(x) for x in d] if isinstance(d, list) else d
        return strip(json.loads(ok("optimize", "--offline", "--json", "--cache", str(path), *args)))

    for args in (("--net", "alexnet", "--workspace", "64MiB"), ("--net", "alexnet", "--workspace", "1MiB"),
                 ("--net", "alexnet", "--optimizer", "wd", "--total-workspace", "120MiB"),
                 ("--net", "resnet18", "--batch", "32", "--optimizer", "wd", "--total-workspace", "16MiB")):
        assert plan(db, *args) == plan(pruned, *args), args


def test_cache_prune_names_a_missing_file(capsys, tmp_path):
    status, _, err = inline(capsys, "cache", "prune", "--cache", str(tmp_path / "none.db"))
    assert status == 2 and "does not exist" in err and not (tmp_path / "none.db").exists()


def test_install_hints_fit_how_ucudnn_was_installed(monkeypatch):
    """They said `pip install '.[plot]' in a clone`, which a wheel's user has not got: an installed
    ucudnn (a wheel, or a clone installed editable) gets the extra by name (pip adds its packages
    to the installed ucudnn), a source tree that pip has not installed by its path."""
    from importlib import metadata

    assert errors.install_extra("plot") == "pip install 'ucudnn[plot]'"  # the test command installs it

    def not_installed(name: str):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "distribution", not_installed)
    assert errors.install_extra("plot") == f"pip install '{REPO}[plot]'"


def test_install_hints_have_one_home():
    """Every message that names an extra of ucudnn's is install_extra's (ucudnn.core.errors);
    another package's extra (pulp[cbc]) is that package's to name."""
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "ucudnn").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"pip install '?(ucudnn|\.)\[", line) and path.name != "errors.py"]
    assert offenders == []


# ---- a shard folder as the cache


@pytest.fixture
def shards(db, tmp_path) -> Path:
    """A folder of two shards: the synthetic database and an empty one."""
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "node1.db").write_bytes(Path(db).read_bytes())
    BenchmarkDatabase(folder / "node2.db").close()
    return folder


@pytest.mark.slow
def test_reading_commands_read_every_shard_of_a_folder(capsys, db, shards, tmp_path):
    before = {path.name: path.read_bytes() for path in shards.iterdir()}
    result = run("optimize", "--offline", "--net", "alexnet", "--json", env_extra={"UCUDNN_CACHE": str(shards)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["total"] == optimize(db, "--net", "alexnet")["total"]
    assert json.loads(result.stdout)["database"] == str(shards)
    assert len(json.loads(ok("cache", "list", "--cache", str(shards), "--json"))["devices"][0]["kernels"]) == 63
    assert "legacy:FFT" in ok("cache", "show", "--net", "alexnet", "--kernel", "conv2/F", "--cache", str(shards))
    assert "exported" in ok("cache", "export", str(tmp_path / "all.json"), "--cache", str(shards))
    assert ok("cache", "verify", "--cache", str(shards)) == f"{shards}: no problems found in 2 shard(s)\n"
    assert {path.name: path.read_bytes() for path in shards.iterdir()} == before


def test_merge_reads_every_shard_of_a_folder(capsys, db, shards, tmp_path):
    """A folder among merge's inputs is its shards, as it is for every command that reads."""
    before = {path.name: path.read_bytes() for path in shards.iterdir()}
    merged = tmp_path / "merged.db"
    out = ok("cache", "merge", str(shards), "--into", str(merged))
    assert out.startswith("merged ") and "from 2 shard(s)" in out
    with BenchmarkDatabase(db, readonly=True) as original, BenchmarkDatabase(merged, readonly=True) as result:
        assert result.kernels() == original.kernels()
    assert {path.name: path.read_bytes() for path in shards.iterdir()} == before


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00" + bytes(4096)])
def test_reading_a_folder_changes_no_shard_even_one_it_cannot_read(capsys, shards, content):
    """A reading command writes nothing: a shard that merging would have to migrate or convert
    (here a 0-byte file, an empty SQLite header) is refused, and every shard stays as it was."""
    (shards / "node3.db").write_bytes(content)
    before = {path.name: path.read_bytes() for path in shards.iterdir()}
    status, out, err = inline(capsys, "cache", "list", "--cache", str(shards))
    assert status == 2 and out == "" and one_line_naming(err, str(shards / "node3.db"))
    assert {path.name: path.read_bytes() for path in shards.iterdir()} == before


def test_verify_names_the_damaged_shard_of_a_folder(capsys, shards, damaged):
    (shards / "node3.db").write_bytes(damaged.read_bytes())
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(shards))
    assert status == 1 and out.startswith(f"{shards / 'node3.db'}: integrity:")


@pytest.mark.parametrize("argv, message", [
    (("cache", "prune"), "is a shard folder; name one database file to prune, e.g. --cache {shards}/node1.db"),
    (("cache", "import", "{export}"), "is a folder; give a file name such as {shards}/benchmarks.db"),
])
def test_writing_commands_name_one_file_of_a_shard_folder(capsys, shards, tmp_path, argv, message):
    export = tmp_path / "x.json"
    export.write_text("{}")
    before = {path.name: path.read_bytes() for path in shards.iterdir()}
    status, _, err = inline(capsys, *(arg.format(export=export) for arg in argv), "--cache", str(shards))
    assert status == 2 and one_line_naming(err, message.format(shards=shards))
    assert {path.name: path.read_bytes() for path in shards.iterdir()} == before


# ---- invalid rows and files that are not ucudnn's: one line, exit 2, no file changed


@pytest.fixture
def copy_of_db(db, tmp_path) -> Path:
    path = tmp_path / "copy.db"
    path.write_bytes(Path(db).read_bytes())
    return path


@pytest.fixture(scope="module")
def exported(db, tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("export") / "export.json"
    ok("cache", "export", str(path), "--cache", db)
    return json.loads(path.read_text())


def edited_export(exported: dict, folder: Path, column: str, value) -> Path:
    """The export with `column` of its first measurement set to `value`."""
    document = json.loads(json.dumps(exported))
    document["measurements"][0][column] = value
    path = folder / "edited.json"
    path.write_text(json.dumps(document))
    return path


INVALID_VALUES = [("time_ms", "fast"), ("cudnn_version", "nine"), ("execution", "teleport"), ("backend", "magic"),
                  ("time_ms", -1.0), ("workspace", -1), ("batch", 0), ("time_ms", float("nan")),
                  ("status", "great"), ("shape_key", "F|described by no kernel row"), ("accumulates", 2),
                  ("timing", "sloppy"), ("repeats", 1.5), ("time_ms", float("inf")), ("algo", ""),
                  ("time_ms", 0.0), ("time_ms", 1e300)]


@pytest.mark.parametrize("column, value", INVALID_VALUES)
def test_import_refuses_an_invalid_value_and_changes_nothing(capsys, exported, copy_of_db, tmp_path, column, value):
    edited, new = edited_export(exported, tmp_path, column, value), tmp_path / "new.db"
    before = checksums(copy_of_db, new, edited)
    for target in (copy_of_db, new):
        status, out, err = inline(capsys, "cache", "import", str(edited), "--cache", str(target))
        assert status == 2 and out == "" and one_line_naming(err, str(edited), "measurements[0]", column, repr(value))
    assert checksums(copy_of_db, new, edited) == before


@pytest.mark.parametrize("column, value", [("workspace", 10**30), ("gpu_name", None), ("time_ms", [1.0])])
def test_import_of_a_value_sqlite_cannot_store_is_one_line(exported, copy_of_db, tmp_path, column, value):
    edited = edited_export(exported, tmp_path, column, value)
    before = checksums(copy_of_db)
    result = run("cache", "import", str(edited), "--cache", str(copy_of_db))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert one_line_naming(result.stderr, str(edited), column, repr(value))
    assert checksums(copy_of_db) == before


def older_export(exported: dict, folder: Path, version: int, column: str, value) -> Path:
    """The export as a ucudnn of schema `version` (4 or older) wrote it, with `column` of its first
    measurement set to `value`."""
    document = json.loads(json.dumps(exported))
    document["schema_version"] = version
    for row in document["measurements"]:
        del row["accumulates"]
    document["measurements"][0][column] = value
    path = folder / "older.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("version, column, value", [(4, "batch", "x"), (4, "recorded_at", None), (4, "gpu_name", [1]),
                                                    (3, "shape_key", "F|described by no kernel row")])
def test_import_of_an_older_export_names_the_bad_value(capsys, exported, copy_of_db, tmp_path, version, column, value):
    """An older export is converted as a file's migration converts it; a bad value is named as in
    a current one, not as whatever the conversion tripped over."""
    edited = older_export(exported, tmp_path, version, column, value)
    before = checksums(copy_of_db, edited)
    status, out, err = inline(capsys, "cache", "import", str(edited), "--cache", str(copy_of_db))
    assert status == 2 and out == "" and one_line_naming(err, str(edited), "measurements[0]", column, repr(value)), err
    assert checksums(copy_of_db, edited) == before


@pytest.mark.parametrize("version", [4.5, "5", None, -1, True, 99])
def test_import_refuses_a_schema_version_no_ucudnn_wrote(capsys, exported, copy_of_db, tmp_path, version):
    document = {**exported, "schema_version": version}
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))
    before = checksums(copy_of_db, edited)
    status, out, err = inline(capsys, "cache", "import", str(edited), "--cache", str(copy_of_db))
    assert status == 2 and out == "" and one_line_naming(err, str(edited), f"schema version {version!r}"
                                                         if version != 99 else "schema version 99"), err
    assert checksums(copy_of_db, edited) == before


@pytest.mark.parametrize("statement, args", [
    # a time of 0 was the fastest of every size: the plan took 0 ms, and its speedup divided by it
    ("UPDATE measurements SET time_ms = 0 WHERE algo = 'ALGO_0' AND status = 'ok'", ()),
    ("UPDATE measurements SET time_ms = 0 WHERE algo = 'ALGO_0' AND status = 'ok'", ("--json",)),
    # times whose sums overflow: the plot's axes and WD's solver met infinities
    ("UPDATE measurements SET time_ms = time_ms * 1e300 WHERE status = 'ok'", ("--plot", "{tmp}/plot.png")),
    ("UPDATE measurements SET time_ms = time_ms * 1e300 WHERE status = 'ok'", ("--total-workspace", "120MiB")),
])
def test_a_time_no_plan_can_add_or_divide_by_is_skipped_not_a_crash(copy_of_db, tmp_path, statement, args):
    spoil(copy_of_db, statement)
    before = checksums(copy_of_db)
    result = run("optimize", "--offline", "--net", "alexnet", "--cache", str(copy_of_db),
                 *(arg.format(tmp=tmp_path) for arg in args))
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr
    warning, *error = result.stderr.splitlines()
    assert "skipped rows" in warning and re.search(r"whose time_ms (0\.0|[\d.]+e\+\d+) is not", warning), warning
    assert len(error) == (result.returncode == 2) and all(line.startswith("ucudnn: error: ") for line in error), error
    assert checksums(copy_of_db) == before


def test_verify_finds_a_value_damaged_inside_a_database(capsys, copy_of_db):
    spoil(copy_of_db, "UPDATE measurements SET time_ms = 'fast' WHERE algo = 'ALGO_0' AND batch = 1 AND status = 'ok'",
          "UPDATE measurements SET execution = 'teleport' WHERE algo = 'ALGO_1' AND batch = 2")
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(copy_of_db))
    assert status == 1 and "no problems" not in out
    assert re.search(r"measurement\(s\) whose time_ms 'fast' is not", out)
    assert re.search(r"measurement\(s\) whose execution 'teleport' is not one of graph, direct", out)


def test_commands_skip_invalid_rows_with_one_warning(copy_of_db, tmp_path):
    spoil(copy_of_db, "UPDATE measurements SET time_ms = 'fast' WHERE algo = 'ALGO_0' AND status = 'ok'",
          "UPDATE measurements SET execution = 'teleport' WHERE algo = 'ALGO_1' AND batch = 2",
          "UPDATE measurements SET workspace = 'lots' WHERE algo = 'ALGO_2' AND batch = 4")
    before = checksums(copy_of_db)
    for argv in (("optimize", "--offline", "--net", "alexnet"), ("cache", "list"), ("cache", "list", "--json"),
                 ("cache", "show", "--net", "alexnet", "--kernel", "conv2/F"),
                 ("cache", "export", str(tmp_path / "export.json"))):
        result = run(*argv, "--cache", str(copy_of_db))
        assert result.returncode == 0 and "Traceback" not in result.stderr, (argv, result.stderr)
        assert one_line_naming(result.stderr, str(copy_of_db), "skipped", "ucudnn cache verify"), (argv, result.stderr)
    assert checksums(copy_of_db) == before
    assert "'fast'" not in (tmp_path / "export.json").read_text() and "teleport" not in (tmp_path / "export.json").read_text()


def test_merge_refuses_a_shard_with_an_invalid_row_and_changes_nothing(capsys, db, copy_of_db, tmp_path):
    spoil(copy_of_db, "UPDATE measurements SET status = 'great' WHERE algo = 'ALGO_0' AND batch = 8")
    existing, new = tmp_path / "existing.db", tmp_path / "new.db"
    existing.write_bytes(Path(db).read_bytes())
    before = checksums(copy_of_db, existing, new)
    for target in (existing, new):
        status, _, err = inline(capsys, "cache", "merge", db, str(copy_of_db), "--into", str(target))
        assert status == 2 and one_line_naming(err, str(copy_of_db), "status 'great' is not one of ok"), err
    assert checksums(copy_of_db, existing, new) == before


FOREIGN = tuple(FOREIGN_TABLES)


@pytest.mark.parametrize("kind", FOREIGN)
def test_writing_commands_refuse_a_file_ucudnn_did_not_make(capsys, db, exported, tmp_path, kind):
    foreign = make_foreign(tmp_path / "other.db", kind)
    export = tmp_path / "export.json"
    export.write_text(json.dumps(exported))
    before = checksums(foreign)
    for argv in (("cache", "prune", "--cache", str(foreign)), ("cache", "import", str(export), "--cache", str(foreign)),
                 ("cache", "merge", db, "--into", str(foreign))):
        status, _, err = inline(capsys, *argv)
        assert status == 2 and one_line_naming(err, str(foreign), "is not a ucudnn benchmark database"), (argv, err)
        assert checksums(foreign) == before, argv


@pytest.mark.parametrize("kind", FOREIGN)
def test_merge_opens_its_inputs_read_only(capsys, db, tmp_path, kind):
    shard, target = make_foreign(tmp_path / "shard.db", kind), tmp_path / "merged.db"
    before = checksums(shard, target)
    status, _, err = inline(capsys, "cache", "merge", db, str(shard), "--into", str(target))
    assert status == 2 and one_line_naming(err, str(shard), "is not a ucudnn benchmark database"), err
    assert checksums(shard, target) == before


@pytest.mark.parametrize("kind", ("empty", "people"))
def test_reading_a_file_ucudnn_did_not_make_says_what_it_is(capsys, tmp_path, kind):
    foreign = make_foreign(tmp_path / "other.db", kind)
    before = checksums(foreign)
    for argv in (("optimize", "--offline", "--net", "alexnet"), ("cache", "list"), ("cache", "export", str(tmp_path / "x.json"))):
        status, _, err = inline(capsys, *argv, "--cache", str(foreign))
        assert status == 2 and one_line_naming(err, str(foreign), "is not a ucudnn benchmark database"), (argv, err)
        assert "schema version" not in err and "writable" not in err
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(foreign))
    assert status == 1 and out.startswith(f"{foreign}: not a ucudnn benchmark database")
    assert checksums(foreign) == before and not (tmp_path / "x.json").exists()


def test_a_shard_folder_skips_an_invalid_row_naming_its_shard(shards):
    spoil(shards / "node1.db", "UPDATE measurements SET workspace = -1 WHERE algo = 'ALGO_0' AND batch = 2")
    before = {path.name: path.read_bytes() for path in shards.iterdir()}
    result = run("cache", "list", "--cache", str(shards))
    assert result.returncode == 0 and one_line_naming(result.stderr, str(shards / "node1.db"), "workspace -1")
    assert {path.name: path.read_bytes() for path in shards.iterdir()} == before


def test_optimize_takes_the_search_and_plans_alike_from_a_full_recording(capsys, db):
    """The shipped recording is a full search's: the pruned search plans from it as the full one
    does (it needs a subset of what is there); a search that is neither is refused in one line."""
    plans = {}
    for search in ("pruned", "full"):
        status, out, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--batch", "256",
                                  "--search", search, "--cache", db, "--json")
        assert status == 0, err
        plans[search] = json.loads(out)["total"]
    assert plans["pruned"] == plans["full"]
    status, _, err = inline(capsys, "optimize", "--offline", "--net", "alexnet", "--search", "quick", "--cache", db)
    assert status == 2 and "quick" in err and "pruned, full" in err


# ---- what a new user meets: names, flags, paths and versions


def _network_file(tmp_path: Path, *layers: dict) -> Path:
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"name": "twice", "layers": list(layers)}))
    return path


@pytest.mark.parametrize("argv", [("nets", "{net}"), ("optimize", "--offline", "--net", "{net}"),
                                  ("optimize", "--offline", "--net", "{net}", "--optimizer", "wd")])
def test_a_layer_name_with_two_shapes_is_refused_at_load_for_every_optimizer(capsys, db, tmp_path, argv):
    """Two layers named `a` of different shapes planned WR with both kernels under the second's
    plan (exit 0); WD refused them. Now loading the file refuses them, in WD's words."""
    net = _network_file(tmp_path, {**BAD_LAYER, "name": "a"}, {**BAD_LAYER, "name": "a", "input_size": 64})
    status, out, err = inline(capsys, *(arg.format(net=net) for arg in argv), *(("--cache", db) if "optimize" in argv
                                                                               else ()))
    assert status == 2 and out == ""
    assert one_line_naming(err, f"network file {net}", "layer names ['a'] occur more than once; give every layer "
                           "its own name, or one layer a count for identical occurrences"), err


def test_a_layer_name_twice_with_one_shape_is_one_layer_counted(capsys, tmp_path):
    net = _network_file(tmp_path, {**BAD_LAYER, "name": "a"}, {**BAD_LAYER, "name": "a"})
    status, out, _ = inline(capsys, "nets", str(net), "--json")
    assert status == 0 and [(layer["name"], layer["count"]) for layer in json.loads(out)["layers"]] == [("a", 2)]


def test_the_version_and_an_unknown_flag(capsys):
    import ucudnn

    status, out, _ = inline(capsys, "--version")
    assert status == 0 and out == f"ucudnn {ucudnn.__version__}\n"
    for argv, prog in ((("--bogus",), "ucudnn"), (("--bogus", "nets"), "ucudnn"), (("cache", "--bogus"), "ucudnn"),
                       (("nets", "--bogus"), "ucudnn")):
        status, _, err = inline(capsys, *argv)
        assert status == 2 and one_line_naming(err, f"{prog}: error: unrecognized arguments: --bogus"), (argv, err)
    for argv, missing in (((), "COMMAND (see ucudnn --help)"), (("cache",), "ACTION (see ucudnn cache --help)")):
        status, _, err = inline(capsys, *argv)
        assert status == 2 and one_line_naming(err, f"the following arguments are required: {missing}"), err


def test_an_empty_cache_path_is_refused(capsys, db, exported, tmp_path):
    """`--cache ''` meant the default database in the home folder: an import wrote there."""
    export = tmp_path / "export.json"
    export.write_text(json.dumps(exported))
    for argv in (("cache", "import", str(export)), ("optimize", "--offline", "--net", "alexnet"), ("cache", "list")):
        status, out, err = inline(capsys, *argv, "--cache", "")
        assert status == 2 and out == ""
        assert one_line_naming(err, "argument --cache: an empty path names no database"), (argv, err)


def test_cache_export_to_standard_output(db, tmp_path):
    """`-` is standard output, as for other tools: the export alone is printed there (it was a
    file named `-`)."""
    result = subprocess.run([sys.executable, "-m", "ucudnn", "cache", "export", "-", "--cache", db],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    ok("cache", "export", str(tmp_path / "file.json"), "--cache", db)
    assert json.loads(result.stdout) == json.loads((tmp_path / "file.json").read_text())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file.json"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
def test_a_plot_path_that_cannot_be_written_is_refused_before_planning(capsys, tmp_path):
    """/proc lets root pass its permission check but makes no file there: the plan was made, then
    the plot failed. The file is tried first; the cache named does not exist, so nothing was read."""
    status, out, err = inline(capsys, "optimize", "--net", "alexnet", "--cache", str(tmp_path / "none.db"),
                              "--plot", "/proc/x.png")
    assert status == 2 and out == "" and one_line_naming(err, "argument --plot: cannot write /proc/x.png"), err


@pytest.mark.parametrize("version", [99])
def test_import_of_a_newer_export_says_export_in_one_line(capsys, exported, copy_of_db, tmp_path, version):
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**exported, "schema_version": version}))
    status, out, err = inline(capsys, "cache", "import", str(newer), "--cache", str(copy_of_db))
    assert status == 2 and out == ""
    assert one_line_naming(err, f"export {newer} has schema version {version}, newer than this ucudnn reads"), err
    assert "benchmark database" not in err and "UCUDNN_CACHE" not in err


def test_import_of_a_missing_file_is_one_line_without_errno(capsys, copy_of_db, tmp_path):
    status, out, err = inline(capsys, "cache", "import", str(tmp_path / "none.json"), "--cache", str(copy_of_db))
    assert status == 2 and out == "" and "Errno" not in err
    assert one_line_naming(err, f"export {tmp_path / 'none.json'} does not exist; check the path"), err


def test_verbose_prints_the_plans_of_optimize_too(db):
    """UCUDNN_VERBOSE said each plan of the handle only: `ucudnn optimize` printed nothing more."""
    quiet = run("optimize", "--offline", "--net", "alexnet", "--cache", db)
    verbose = run("optimize", "--offline", "--net", "alexnet", "--cache", db, env_extra={"UCUDNN_VERBOSE": "1"})
    assert quiet.returncode == verbose.returncode == 0 and quiet.stderr == ""
    assert verbose.stdout == quiet.stdout
    lines = verbose.stderr.splitlines()
    assert len(lines) == 15 and all(re.fullmatch(r"ucudnn: conv\d/(F|BD|BF): .+, [\d.]+ MiB of workspace, "
                                                 r"[\d.]+ ms predicted", line) for line in lines), lines


@pytest.mark.parametrize("action, folders", [("import", False), ("prune", False), ("list", True), ("export", True)])
def test_cache_help_claims_shard_folders_only_where_they_are_taken(capsys, action, folders):
    out = " ".join(inline(capsys, "cache", action, "--help")[1].split())  # unwrapped
    assert ("not a folder of shards" not in out) is folders and ("or a folder of shards" in out) is folders


def test_no_message_points_at_the_docs_folder_which_a_wheel_lacks():
    """A hint names `ucudnn COMMAND --help` (or a command), not docs/*.md: an installed wheel has
    no docs/. Docstrings and comments may cite the docs."""
    import ast

    found = []
    for path in (REPO / "ucudnn").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and re.search(r"docs/\w+\.md", node.value)]
    assert found == []


def test_a_network_file_that_is_no_object_points_at_the_help(capsys, tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[]")
    status, _, err = inline(capsys, "nets", str(path))
    assert status == 2 and one_line_naming(err, "`ucudnn nets --help` describes it"), err


def test_an_error_about_the_database_names_the_variable_that_chose_it(tmp_path):
    """Errors of settings read from UCUDNN_* variables name the variable; a database path from
    UCUDNN_CACHE was named as if passed with --cache."""
    missing = tmp_path / "none" / "x.db"
    for argv in (("optimize", "--offline", "--net", "alexnet"), ("cache", "import", str(tmp_path / "e.json"))):
        (tmp_path / "e.json").write_text("{}")
        result = run(*argv, env_extra={"UCUDNN_CACHE": str(missing)})
        assert result.returncode == 2 and one_line_naming(result.stderr, str(missing), f"(UCUDNN_CACHE={missing})"), argv
    result = run("optimize", "--offline", "--net", "alexnet", "--cache", str(missing),
                 env_extra={"UCUDNN_CACHE": str(missing)})
    assert result.returncode == 2 and "UCUDNN_CACHE" not in result.stderr  # the flag named it
    result = run("optimize", "--offline", "--net", "alexnet", env_extra={"UCUDNN_WORKSPACE_LIMIT": "lots"})
    assert result.returncode == 2 and one_line_naming(result.stderr, "UCUDNN_WORKSPACE_LIMIT='lots' is not a size")


def test_sigterm_stops_a_command_after_its_cleanup_with_the_shells_status(capsys):
    """`timeout` and schedulers send SIGTERM: the command's `finally` blocks run (a sweep merges
    what its workers measured) and it exits 143, as a command the signal ends would."""
    import argparse

    from ucudnn.cli import MEASURED, _run

    before, cleaned = signal.getsignal(signal.SIGTERM), []

    def run(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)
    assert _run(argparse.Namespace(run=run, cache=None, stopped=MEASURED)) == 143 and cleaned
    assert "stopped by SIGTERM; what was measured is kept" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before


# ---- what export and import keep, and what a stop leaves


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_export_never_writes_over_a_database_or_its_source(capsys, copy_of_db, tmp_path, force):
    """`cache export b.db --cache a.db` turned the database b.db into JSON text, and `cache export
    self.db --cache self.db` its own source, with exit status 0: refused, with --force too."""
    other, foreign = tmp_path / "other.db", make_foreign(tmp_path / "foreign.db", "people")
    other.write_bytes(copy_of_db.read_bytes())
    before = checksums(copy_of_db, other, foreign)
    for target, said in ((copy_of_db, "is the database being exported"),
                         (other, "is a database, which an export never replaces"),
                         (foreign, "is a database, which an export never replaces")):
        status, out, err = inline(capsys, "cache", "export", str(target), "--cache", str(copy_of_db), *force)
        assert status == 2 and out == "" and one_line_naming(err, f"{target} {said}; name a new file"), err
    result = run("cache", "export", str(other), "--cache", str(copy_of_db), *force)  # as users run it
    assert result.returncode == 2 and one_line_naming(result.stderr, str(other)) and result.stdout == ""
    assert checksums(copy_of_db, other, foreign) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db", "foreign.db", "other.db"]


def test_export_replaces_an_existing_file_only_with_force(capsys, db, tmp_path):
    target = tmp_path / "old.json"
    target.write_text("an older export")
    status, out, err = inline(capsys, "cache", "export", str(target), "--cache", db)
    assert status == 2 and one_line_naming(err, f"{target} exists; name a new file", "add --force to replace it")
    assert target.read_text() == "an older export"
    status, out, err = inline(capsys, "cache", "export", str(target), "--cache", db, "--force")
    assert status == 0 and err == "" and out.startswith("exported ")
    assert json.loads(target.read_text())["format"] == "ucudnn-benchmarks"
    assert [p.name for p in tmp_path.iterdir()] == ["old.json"]


def test_import_says_what_it_kept_replaced_and_left_out(capsys, exported, copy_of_db, tmp_path):
    """Two rows of one key said "imported 2 measurements", and one was kept."""
    timed = [row for row in exported["measurements"] if row["time_ms"] is not None and row["timing"] == "default"]
    first, second, third = timed[:3]
    document = {**exported, "measurements": [
        first, {**first, "time_ms": first["time_ms"] * 2},  # one key twice, ranked alike: the later kept
        second,  # the database's own
        {**third, "timing": "quick"},  # ranked below the database's default-timed measurement
        {**third, "algo": "ANOTHER"}]}  # a new key
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(document))
    with sqlite3.connect(copy_of_db) as conn:
        (before,) = conn.execute("SELECT count(*) FROM measurements").fetchone()
    conn.close()
    status, out, err = inline(capsys, "cache", "import", str(path), "--cache", str(copy_of_db))
    assert status == 0 and err == ""
    assert out == (f"imported 2 of the 5 measurements of {path} into {copy_of_db}: 1 new, 1 replacing the "
                   "database's; left out: 2 where the database's is the same or ranks higher, 1 duplicate(s) of a "
                   "key in the file (of each key the higher-ranked row is kept, else the later)\n")
    with sqlite3.connect(copy_of_db) as conn:
        assert conn.execute("SELECT count(*) FROM measurements").fetchone() == (before + 1,)
        assert conn.execute("SELECT time_ms FROM measurements WHERE algo = ? AND batch = ? AND shape_key = ?",
                            (first["algo"], first["batch"], first["shape_key"])).fetchone() == (first["time_ms"] * 2,)
    conn.close()


@pytest.fixture(scope="module")
def large_export(exported, tmp_path_factory) -> Path:
    """An export of 86,000 measurements (the shipped recording holds 85,859): the synthetic GPU's
    rows, copied to as many GPUs of other names as that takes."""
    rows = exported["measurements"]
    copies = -(-86_000 // len(rows))
    document = {**exported, "measurements": [{**row, "gpu_name": f"Synthetic GPU {i}"}
                                             for i in range(copies) for row in rows][:86_000]}
    path = tmp_path_factory.mktemp("large") / "large.json"
    path.write_text(json.dumps(document))
    return path


def measurements_in(path: Path) -> int | None:
    """The rows of a database's measurements table; None where there is no file."""
    if not path.exists():
        return None
    with sqlite3.connect(path) as conn:
        (count,) = conn.execute("SELECT count(*) FROM measurements").fetchone()
    conn.close()
    return count


# A command whose process sends itself SIGINT once an import has written every row and before it
# commits: Ctrl-C at the moment that loses the most, whatever the machine's speed. SIGINT is
# Python's KeyboardInterrupt there, as at a terminal, even where the suite runs as a background job
# (whose commands inherit SIGINT ignored).
INTERRUPTED_IMPORT = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from ucudnn.cli import main
from ucudnn.measure.cache import adding
upsert = adding.upsert
def interrupted(conn, kernels, measurements):
    upsert(conn, kernels, measurements)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # KeyboardInterrupt arrives here, inside the write transaction
adding.upsert = interrupted
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("into", ["existing", "new"])
def test_ctrl_c_during_an_import_leaves_the_database_as_it_was(copy_of_db, large_export, tmp_path, into):
    """Ctrl-C during an import keeps none of it, in a new file or one that held rows, and says so,
    not that "what was measured is kept". A real SIGINT reaches the command's process with every
    row written and not committed (INTERRUPTED_IMPORT)."""
    target = copy_of_db if into == "existing" else tmp_path / "new.db"
    journal = target.with_name(target.name + "-journal")
    before = measurements_in(target)
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, "cache", "import", str(large_export), "--cache",
                           str(target)], capture_output=True, text=True, env=environment(), timeout=120)
    assert measurements_in(target) == before and not journal.exists()
    assert done.returncode == 130 and done.stdout == "", done.stderr
    assert one_line_naming(done.stderr, "stopped by Ctrl-C; an import is one transaction"), done.stderr
    assert "measured" not in done.stderr


def test_a_database_with_overwritten_pages_is_one_line_and_verify_details_lists_them(capsys, exported, copy_of_db,
                                                                                    tmp_path):
    """A page overwritten by another made every command print SQLite's whole report: 101 lines."""
    overwrite_root(copy_of_db, "measurements", "sqlite_autoindex_kernels_1")
    export = tmp_path / "export.json"
    export.write_text(json.dumps(exported))
    for argv in (("optimize", "--offline", "--net", "alexnet"), ("cache", "list"), ("cache", "export", "-"),
                 ("cache", "import", str(export))):
        status, out, err = inline(capsys, *argv, "--cache", str(copy_of_db))
        assert status == 2 and out == "" and one_line_naming(err, str(copy_of_db), "is damaged (SQLite's quick "
                                                             "check reports", "cache verify"), (argv, err)
    status, out, _ = inline(capsys, "cache", "verify", "--cache", str(copy_of_db))
    assert status == 1 and out.count("\n") == 1, out
    assert out.startswith(f"{copy_of_db}: integrity: SQLite's integrity check reports ") and "--details" in out
    status, details, _ = inline(capsys, "cache", "verify", "--details", "--cache", str(copy_of_db))
    lines = details.splitlines()
    assert status == 1 and len(lines) > 1 and "***" not in details
    assert all(line.startswith(f"{copy_of_db}: integrity: ") for line in lines), details


@pytest.mark.parametrize("argv", [("cache", "list"), ("optimize", "--offline", "--net", "alexnet")])
def test_ucudnn_cache_path_is_refused_in_one_line_naming_ucudnn_cache(db, argv):
    """UCUDNN_CACHE_PATH, documented nowhere, chose the database where UCUDNN_CACHE was unset."""
    for env in ({"UCUDNN_CACHE_PATH": db}, {"UCUDNN_CACHE_PATH": db, "UCUDNN_CACHE": db}):
        result = run(*argv, env_extra=env)
        assert result.returncode == 2 and result.stdout == ""
        assert one_line_naming(result.stderr, f"UCUDNN_CACHE_PATH={db!r} is not read", "UCUDNN_CACHE"), result.stderr
