"""CPU tests of bench/torch_shapes.py, bench/cold_start.py and bench/train_step.py: shapes,
verdicts, bookkeeping, tables and milestone parsing, and one shape measured end to end on the CPU (a
NumPy backend in place of cuDNN, perf_counter in place of CUDA events). Their GPU runs are
bench/gpu_suite.sh's `shapes`, `coldstart` and `train` stages."""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import math
import os
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


shapes = _load("torch_shapes")
cold = _load("cold_start")
train = _load("train_step")
DEFAULT = shapes.random_layers(24, 0)


# --- torch_shapes: the shapes ------------------------------------------------------------------------

def test_shapes_are_deterministic_per_seed():
    assert shapes.random_layers(24, 0) == DEFAULT
    assert shapes.random_layers(24, 1) != DEFAULT
    assert shapes.random_layers(5, 0) == DEFAULT[:5]  # a shorter run measures the same first shapes


@pytest.mark.parametrize("seed", range(8))
def test_shapes_are_valid_convolutions_within_the_caps(seed):
    for spec in shapes.random_layers(48, seed):
        assert spec.in_channels % spec.groups == 0 and spec.out_channels % spec.groups == 0, spec
        assert spec.kernel in shapes.KERNEL_SIZES and spec.stride in (1, 2) and spec.dilation in (1, 2), spec
        assert 0 <= spec.padding < spec.dilation * (spec.kernel - 1) + 1 or spec.padding == 0, spec
        assert 1 <= spec.batch <= shapes.MAX_BATCH and 1 <= spec.height <= 112 and 1 <= spec.width <= 112, spec
        assert min(spec.output_hw) >= 1, spec
        elements, macs = shapes.per_sample(spec)
        assert spec.batch * elements <= shapes.MAX_ELEMENTS and spec.batch * macs <= shapes.MAX_MACS, spec


def test_shapes_are_what_torch_computes():
    torch = pytest.importorskip("torch")
    for spec in shapes.random_layers(48, 3):
        conv = torch.nn.Conv2d(**spec.conv_kwargs(), device="meta")
        y = conv(torch.empty(spec.input_shape, device="meta"))
        assert tuple(y.shape) == (spec.batch, spec.out_channels, *spec.output_hw), spec


def test_default_shapes_cover_groups_depthwise_dilation_stride_odd_batches_and_both_precisions():
    assert {s.groups for s in DEFAULT if s.family == "grouped"} - {1}
    assert all(s.groups == s.in_channels > 1 for s in DEFAULT if s.family == "depthwise")
    assert any(s.dilation == 2 for s in DEFAULT) and any(s.stride == 2 for s in DEFAULT)
    assert {s.batch % 2 for s in DEFAULT} == {0, 1} and {s.bias for s in DEFAULT} == {False, True}
    assert {s.kernel for s in DEFAULT} == set(shapes.KERNEL_SIZES)
    assert any(s.height != s.width for s in DEFAULT)
    assert max(s.batch for s in DEFAULT) > 64 and max(s.height for s in DEFAULT) > 64


@pytest.mark.parametrize("seed", range(4))
def test_every_family_comes_in_both_precisions_within_12_layers(seed):
    drawn = Counter((s.family, s.precision) for s in shapes.random_layers(12, seed))
    assert set(drawn) == {(f, p) for f in shapes.FAMILIES for p in shapes.PRECISIONS}
    for spec in shapes.random_layers(12, seed):  # odd at 1 and 2 mod 4; even elsewhere but where 2 do not fit
        assert spec.batch % 2 == 1 if spec.index % 4 in (1, 2) else spec.batch % 2 == 0 or spec.batch == 1, spec


def test_a_large_layer_is_cut_to_the_caps_keeping_its_batch_parity():
    huge = shapes.LayerSpec(0, "dense", "fp32", 95, 256, 256, 7, 1, 3, 1, 1, False, 112, 112)
    small = shapes.shrink(huge)
    assert small.height < 112 and small.width < 112 and small.batch % 2 == 1
    elements, macs = shapes.per_sample(small)
    assert small.batch * macs <= shapes.MAX_MACS < (small.batch + 2) * macs
    fits = shapes.replace_spec(huge, in_channels=8, out_channels=8, kernel=1, padding=0, batch=96)
    assert shapes.shrink(fits) == fits


# --- torch_shapes: timing, verdicts, tables -----------------------------------------------------------

def test_verdict_allows_the_noise_margin_and_no_more():
    assert shapes.verdict(1.0, 0.5) == "PASS" and shapes.verdict(1.0, 1.0) == "PASS"
    assert shapes.verdict(1.0, 1.0 + shapes.MARGIN - 1e-9) == "PASS"
    assert shapes.verdict(1.0, 1.0 + shapes.MARGIN + 1e-6) == "FAIL"
    assert shapes.verdict(1.0, 1.08, margin=0.1) == "PASS"


def test_error_limits_per_dtype_and_bf_micro_batches():
    assert shapes.error_limit("fp32", "y") == 2 * shapes.ROUNDING_BOUNDS["fp32"]
    assert shapes.error_limit("amp", "dx", bf_parts=4) == 2 * shapes.ROUNDING_BOUNDS["amp"]
    assert shapes.error_limit("amp", "dw", bf_parts=4) == 4 * shapes.error_limit("amp", "dw")


def test_rounds_rotate_who_goes_first_and_report_ms_per_step():
    calls = []

    def time_loop(loop):
        loop()
        return 10.0  # ms for the whole loop
    times = shapes.alternate_rounds({"torch": lambda: calls.append("t"), "ucudnn": lambda: calls.append("u"),
                                     "control": lambda: calls.append("c")}, time_loop, rounds=4, steps=2)
    assert times == {"torch": [5.0] * 4, "ucudnn": [5.0] * 4, "control": [5.0] * 4}
    assert "".join(calls) == "ttuucc" + "uucctt" + "ccttuu" + "ttuucc"
    assert shapes.spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)


SUMMARY = {"kernels": [{"kind": "BF", "via": "ucudnn", "parts": 2}, {"kind": "F", "via": "ucudnn", "parts": 1},
                       {"kind": "BD", "via": "torch"}], "runs": {"ucudnn:F": 9}, "fallbacks": {}}


def test_via_names_the_kernels_ucudnn_and_torch_ran():
    assert shapes.via(SUMMARY) == "ucudnn F(1) BF(2); torch BD"
    assert shapes.via({"kernels": SUMMARY["kernels"][:2], "fallbacks": {}}) == "ucudnn F(1) BF(2)"
    assert shapes.via({"kernels": [], "fallbacks": {"input on cpu": 3}}) == "torch (fallback: input on cpu)"
    assert shapes.bf_parts(SUMMARY) == 2 and shapes.bf_parts({"kernels": []}) == 1


def make_row(index: int = 0, torch_ms: float = 1.0, ucudnn_ms: float = 0.9, dw_error: float = 1e-3) -> dict:
    spec = shapes.LayerSpec(index, "grouped", "amp", 37, 32, 64, 3, 2, 1, 1, 4, True, 56, 56)
    times = {"torch": [torch_ms, torch_ms * 1.01], "ucudnn": [ucudnn_ms] * 2, "control": [torch_ms * 1.01] * 2}
    return shapes.result_row(spec, times, {"y": 1e-4, "dw": dw_error}, SUMMARY, 0.5)


def test_result_row_and_its_table_row():
    row = make_row()
    assert row["ratio"] == pytest.approx(1.005 / 0.9) and row["verdict"] == "PASS" and row["correct"]
    assert row["error_limits"] == {"y": 2e-2, "dw": 4e-2}  # amp; BF ran in 2 parts
    assert shapes.table_row(row) == ("| 0 | grouped | B=37 32->64 k3 s2 p1 d1 g4 56x56 bias | amp | 1.005 | 0.900 | "
                                     "1.117 | PASS | 0.995 | ok dw 1.0e-03 (4.0e-02) | ucudnn F(1) BF(2); torch BD |")
    assert row["control_verdict"] == "PASS" and row["control_ratio"] == pytest.approx(1.005 / 1.01)
    assert shapes.table_row(row).count("|") == shapes.TABLE_HEAD.splitlines()[0].count("|")
    assert "WRONG dw" in shapes.table_row(make_row(dw_error=0.5))
    error = dict(layer=row["layer"], shape=row["shape"], error="RuntimeError: out of memory\nmore")
    assert shapes.table_row(error).endswith("| ERROR | - | - | RuntimeError: out of memory |")
    assert shapes.table_row(error).count("|") == shapes.TABLE_HEAD.splitlines()[0].count("|")


def test_findings_state_the_bar_over_what_was_measured():
    passing = shapes.findings([make_row(0), make_row(1, ucudnn_ms=1.0)], planned=2)
    assert passing[0].startswith("Bar") and ": PASS on 2 of 2" in passing[0]
    slow = shapes.findings([make_row(0), make_row(1, ucudnn_ms=1.2)], planned=3)
    assert ": FAIL on 2 of 3" in slow[0] and "1 slower" in slow[0] and "1 not reached" in slow[0]
    assert "#1" in slow[1]  # the worst shape
    assert slow[3].startswith("A/A control") and "0 of 2 shapes" in slow[3] and "median 0.995" in slow[3]
    wrong = shapes.findings([make_row(0, dw_error=1.0)], planned=1)
    assert ": FAIL" in wrong[0] and "WRONG #0" in wrong[-1]
    assert ": FAIL on 0 of 4" in shapes.findings([], planned=4)[0]


def test_out_of_time_keeps_room_for_the_slowest_shape():
    assert shapes.out_of_time(9.0, []) and not shapes.out_of_time(11.0, [])
    assert shapes.out_of_time(20.0, [4.0, 14.0]) and not shapes.out_of_time(22.0, [4.0, 14.0])


def test_arguments_and_their_defaults(tmp_path):
    args = shapes.parse_args(["--out", str(tmp_path)])
    assert (args.count, args.seed, args.limit, args.steps, args.rounds) == (24, 0, "4GiB", 50, 9)
    assert args.cache == str(tmp_path / "ucudnn-bench.db") and args.margin == shapes.MARGIN


# --- torch_shapes: one shape on the CPU, and the run's bookkeeping ---------------------------------------

def cpu_time_loop(loop) -> float:
    began = time.perf_counter()
    loop()
    return (time.perf_counter() - began) * 1e3


@pytest.fixture
def cpu_measure(tmp_path, monkeypatch):
    """measure_layer on the CPU: ucudnn.torch with the NumPy backend of the CPU tests."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH))  # conv_step
    import ucudnn.torch as ut
    from torch_doubles import NumpyFramework
    from ucudnn.measure.cache import Cache

    def convert_copy(module):
        context = ut.Context(framework=NumpyFramework(), cache=Cache(tmp_path / "bench.db"), workspace_limit="64KiB")
        return ut.convert(copy.deepcopy(module), context=context)
    args = SimpleNamespace(warmup=1, rounds=2, steps=2, margin=shapes.MARGIN)
    return lambda spec: shapes.measure_layer(spec, convert_copy, cpu_time_loop, lambda: None, "cpu", args)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("precision", shapes.PRECISIONS)
def test_one_shape_end_to_end_on_the_cpu(cpu_measure, precision):
    spec = shapes.LayerSpec(0, "grouped", precision, 5, 4, 6, 3, 2, 1, 2, 2, True, 9, 8)
    row = cpu_measure(spec)
    assert row["correct"], row["errors"]
    assert set(row["errors"]) == {"y", "dx", "dw", "db"}
    assert row["via"].startswith("ucudnn F(") and "BD(" in row["via"] and "BF(" in row["via"]
    assert "torch" not in row["via"]
    assert len(row["rounds"]["torch"]) == 2 and row["torch_ms"] > 0 and row["ucudnn_ms"] > 0
    assert len(row["rounds"]["control"]) == 2 and row["control_ratio"] > 0
    json.dumps(row)  # the report is JSON


def test_the_run_writes_after_every_shape_and_stops_at_the_deadline(tmp_path):
    meta = dict(limit="4GiB", count=3, seed=0, steps=2, rounds=2, margin=shapes.MARGIN)
    layers = shapes.random_layers(3, 0)

    def measure(spec):
        if spec.index == 1:
            raise RuntimeError("CUDNN_STATUS_BAD_PARAM")
        return make_row(spec.index)
    rows = shapes.measure_all(layers, measure, meta, tmp_path, deadline_s=1e6)
    assert [("error" in r) for r in rows] == [False, True, False]
    saved = json.loads((tmp_path / "torch_shapes.json").read_text())
    assert len(saved["rows"]) == 3 and "1 errors" in saved["findings"][0]
    assert "| ERROR |" in (tmp_path / "torch_shapes.md").read_text()
    assert shapes.measure_all(layers, measure, meta, tmp_path, deadline_s=5) == []
    assert "3 not reached" in (tmp_path / "torch_shapes.md").read_text()


# --- cold_start ----------------------------------------------------------------------------------------

COLD_ARGS = SimpleNamespace(batch=256, backend="engines", cache="/tmp/cold.db", limit="64MiB")


def test_the_sweep_command_is_one_the_cli_accepts():
    from ucudnn.cli import build_parser

    command = cold.sweep_command(COLD_ARGS)
    assert command[1:3] == ["-m", "ucudnn"]
    args = build_parser().parse_args(command[3:])
    assert (args.command, args.net, args.batch, args.dtype, args.policy, args.backend, args.cache, args.json) == (
        "optimize", "torchvision:alexnet", 256, "float32", "powerOfTwo", "engines", "/tmp/cold.db", True)
    assert args.workspace == 64 * 2**20


def test_run_process_keeps_the_json_document_of_a_real_process():
    printed = 'import json; print("progress"); print(json.dumps({"measured": True}, indent=1))'
    record = cold.run_process([sys.executable, "-c", printed], dict(os.environ), timeout=60)
    assert record["document"] == {"measured": True} and "error" not in record
    failed = cold.run_process([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), timeout=60)
    assert failed["document"] is None and failed["error"].startswith("exit code 3")


def test_json_document_skips_what_comes_before_it():
    assert cold.json_document('warning: x\n{\n  "seconds": 41.5\n}\n') == {"seconds": 41.5}
    assert cold.json_document("Traceback ...\nError") is None
    assert cold.json_document("{ not json") is None


CHILD_OUT = "\n".join([
    cold.milestone_line("interpreter", 0.031), cold.milestone_line("import torch", 1.2),
    "UserWarning: something", cold.milestone_line("import torchvision", 1.5),
    cold.milestone_line("import ucudnn.torch", 1.6), cold.milestone_line("import cupy", 1.9),
    cold.milestone_line("CUDA context", 2.3), cold.milestone_line("model and batch on the GPU", 2.5),
    cold.milestone_line("convert", 2.51), cold.milestone_line("ucudnn handle", 2.7),
    cold.milestone_line("first forward", 3.4), cold.milestone_line("first iteration", 4.1),
    cold.milestone_line("second iteration", 4.13),
    cold.RESULT + " " + json.dumps(dict(kernels=14, micro_batched=9, via_torch=0, fallbacks={})),
])


def test_milestones_and_result_are_parsed_from_the_childs_output():
    milestones, result = cold.parse_child(CHILD_OUT)
    assert milestones[0] == ("interpreter", 0.031) and milestones[1] == ("import torch", 1.2)
    assert len(milestones) == 12 and result["micro_batched"] == 9
    assert cold.phases(milestones)[1] == ("import torch", pytest.approx(1.169))
    assert cold.dominant(milestones) == ("import torch", pytest.approx(1.169))
    assert cold.dominant(milestones[:3], "first iteration") is None
    assert cold.first_over_second(milestones) == pytest.approx((4.1 - 2.7) - 0.03)
    assert cold.first_over_second(milestones[:-1]) is None


def sweep_record(wall_s: float = 48.0) -> dict:
    plan = {"measured": True, "kernels": [{"configuration": {"micro": [{}, {}]}}, {"configuration": {"micro": [{}]}}],
            "total": {"time_ms": 12.5}}
    return dict(wall_s=wall_s, document=plan)


TORCH_ONLY_OUT = "\n".join([cold.milestone_line("import torch", 1.1), cold.milestone_line("import torchvision", 1.4),
                            cold.milestone_line("first iteration", 3.0)])


HANDLE_OUT = "\n".join([cold.milestone_line("import ucudnn", 0.4), cold.milestone_line("import cupy, CUDA context", 0.9),
                        cold.milestone_line("ucudnn handle", 1.0), cold.milestone_line("first iteration", 1.8),
                        cold.RESULT + " " + json.dumps(dict(kernels=15, micro_batched=12, via_torch=0))])


def cold_report(wall_s: float = 48.0, child_out: str = CHILD_OUT, handle_out: str = HANDLE_OUT) -> dict:
    return dict(batch=256, limit="64MiB", backend="engines", sweep=cold.sweep_summary(sweep_record(wall_s)),
                second_process=cold.first_iteration_summary(dict(wall_s=4.3, stdout=child_out)),
                torch_only=cold.first_iteration_summary(dict(wall_s=3.2, stdout=TORCH_ONLY_OUT)),
                handle_only=cold.first_iteration_summary(dict(wall_s=2.0, stdout=handle_out)),
                rows_after_sweep=1000, rows_added_by_second_process=0, cudnn_versions=[91900])


def test_sweep_summary():
    sweep = cold.sweep_summary(sweep_record())
    assert sweep["total_s"] == 48.0 and sweep["measured"] is True and sweep["kernels"] == 2
    assert sweep["planned_micro_batched"] == 1 and sweep["planned_ms"] == 12.5 and sweep["errors"] == []
    timed_out = cold.sweep_summary(dict(wall_s=120.2, error="timed out after 120 s"))
    assert timed_out["errors"] == ["timed out after 120 s"] and timed_out["kernels"] is None
    assert cold.sweep_summary(dict(wall_s=5.0, document=None))["errors"] == ["no JSON document in its output"]


def test_verdicts_and_report():
    notes = cold.verdicts(cold_report())
    assert notes[0].startswith("Bar (a)") and "48.0 s (PASS" in notes[0]
    assert "4.10 s (PASS)" in notes[1] and notes[2] == "(b) dominated by: import torch (1.17 s)"
    assert notes[3] == ("(c) torch alone reaches its first iteration in 3.00 s (imports of torch and torchvision: "
                        "1.40 s); from those imports on, 2.60 s with ucudnn vs 1.60 s without: ucudnn's part is 1.00 s")
    assert "(FAIL" in cold.verdicts(cold_report(wall_s=70.0))[0]
    unsplit = CHILD_OUT.replace('"micro_batched": 9', '"micro_batched": 0')
    assert "no kernel was micro-batched" in cold.verdicts(cold_report(child_out=unsplit))[1]
    crashed = cold_report(child_out=CHILD_OUT.split("\n")[0])
    crashed["second_process"]["error"] = "exit code 1"
    assert cold.verdicts(crashed)[1] == "Bar (b): not reached (exit code 1)"
    text = cold.markdown(cold_report())
    assert "| first iteration | 4.100 | 0.700 |" in text and "cuDNN versions in it: [91900]" in text
    assert "## (c) milestones of torch alone" in text and "| first iteration | 3.000 | 1.600 |" in text
    assert notes[4] == "(d) the drop-in handle without torch: the conv kernels' first micro-batched iteration " \
                       "1.80 s after launch (PASS against 5 s)"
    assert "## (d) milestones of the drop-in handle without torch" in text and "| ucudnn handle | 1.000 | 0.100 |" in text
    slow = cold_report(handle_out=HANDLE_OUT.replace(cold.milestone_line("first iteration", 1.8),
                                                     cold.milestone_line("first iteration", 6.2)))
    assert cold.verdicts(slow)[4].endswith("6.20 s after launch (FAIL against 5 s)")
    failed = cold_report(handle_out="")
    failed["handle_only"]["error"] = "exit code 1: ImportError"
    assert cold.verdicts(failed)[4] == "(d) the drop-in handle: not reached (exit code 1: ImportError)"


def test_database_bookkeeping(tmp_path):
    import sqlite3

    database = tmp_path / "cold.db"
    assert cold.rows_in(database) == 0 and cold.cudnn_versions_in(database) == []
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE measurements (cudnn_version INTEGER)")
        connection.executemany("INSERT INTO measurements VALUES (?)", [(91900,), (91900,), (91000,)])
    connection.close()
    (tmp_path / "cold.db-wal").write_text("")
    assert cold.rows_in(database) == 3 and sorted(cold.cudnn_versions_in(database)) == [91000, 91900]
    cold.empty(database)
    assert list(tmp_path.iterdir()) == []


# --- train_step ----------------------------------------------------------------------------------------

MiB = 2**20


def test_the_blocker_leaves_the_runs_own_peak_plus_the_headroom():
    assert train.blocker_bytes(10240 * MiB, 1024 * MiB, 3072 * MiB, 64 * MiB) == (10240 - 2048 - 64) * MiB
    # a footprint below what is held already needs nothing more
    assert train.blocker_bytes(10240 * MiB, 3072 * MiB, 1024 * MiB, 64 * MiB) == (10240 - 64) * MiB
    assert train.blocker_bytes(2112 * MiB, 0, 2048 * MiB, 64 * MiB) == 0
    with pytest.raises(ValueError, match=r"^the GPU cannot hold the run plus the headroom: 1000 MiB free, the run "
                                         r"needs 2000 MiB more \(footprint 3000 MiB, 1000 MiB held\), headroom 64 MiB$"):
        train.blocker_bytes(1000 * MiB, 1000 * MiB, 3000 * MiB, 64 * MiB)


def planned(plan: list, net: str = "alexnet", precision: str = "fp32") -> list[str]:
    return [variant for n, _, p, variant in plan if (n, p) == (net, precision)]


def test_the_plan_runs_footprint_first_once_where_it_is_needed():
    plan = train.plan("alexnet:256,resnet50:64", "fp32,amp", "torch,wr-pressure,wr,torch-pressure")
    assert len(plan) == 4 * 5 and plan[5] == ("alexnet", 256, "amp", "footprint")
    for net in ("alexnet", "resnet50"):
        for precision in ("fp32", "amp"):
            assert planned(plan, net, precision) == ["footprint", "torch", "wr-pressure", "wr", "torch-pressure"]
    assert planned(train.plan("alexnet:256", "fp32", "torch,wr,wr-cold,wr-all")) == ["torch", "wr", "wr-cold", "wr-all"]
    assert planned(train.plan("alexnet:256", "fp32", "wr-pressure,footprint,wr-pressure")) == ["footprint", "wr-pressure"]
    assert planned(train.plan("alexnet:256", "fp32", "footprint")) == ["footprint"]
    assert planned(train.plan("alexnet:256", "fp32", train.DEFAULT_VARIANTS)) == train.DEFAULT_VARIANTS.split(",")


def test_what_each_variant_runs():
    assert {n for n, v in train.VARIANTS.items() if v.pressure} == {
        "torch-pressure", "wr-pressure", "wr-all-pressure", "wd-pressure", "auto-pressure"}
    assert [n for n, v in train.VARIANTS.items() if not v.ucudnn] == ["torch", "torch-pressure"]
    values = dict(limit="64MiB", wd_total="96MiB", sample_input="x")

    def keywords(name):
        return train.convert_keywords(train.VARIANTS[name], values)
    assert keywords("footprint") == dict(optimizer="wr", workspace_limit=0, delegate=False)
    assert keywords("wr") == keywords("wr-cold") == keywords("wr-pressure") == dict(optimizer="wr", workspace_limit="64MiB")
    assert keywords("wr-all") == keywords("wr-all-pressure") == dict(optimizer="wr", workspace_limit="64MiB",
                                                                     delegate=False)
    assert keywords("wd-pressure") == dict(optimizer="wd", workspace_limit="64MiB", total_limit="96MiB", sample_input="x")
    assert keywords("auto-pressure") == dict(optimizer="wd", workspace_limit="64MiB", total_limit="auto")


def test_arguments_their_defaults_and_unknown_variants(tmp_path, capsys):
    args = train.parse_args(["--out", str(tmp_path)])
    assert (args.limit, args.free, args.wd_total, args.free_bytes) == ("64MiB", "64MiB", "64MiB", 64 * MiB)
    assert args.variants == train.DEFAULT_VARIANTS and args.cache == str(tmp_path / "ucudnn-bench.db")
    assert train.parse_args(["--out", str(tmp_path), "--free", "1GiB"]).wd_total == "1GiB"
    for variants in ("torch,capped", "native"):
        with pytest.raises(SystemExit):
            train.parse_args(["--out", str(tmp_path), "--variants", variants])
    assert "unknown variant(s) or precision(s): ['native']" in capsys.readouterr().err


def test_the_child_gets_the_runs_settings(tmp_path):
    args = train.parse_args(["--out", str(tmp_path), "--free", "128MiB", "--limit", "32MiB", "--iters", "7"])
    row = dict(net="resnet50", batch=64, precision="amp", variant="wd-pressure")
    command = train.child_command(args, row, "/tmp/own.db", tmp_path / "r.json", 3 * 2**30)
    child = train.parse_args(command[2:])
    assert command[1] == train.__file__ and child.child and child.result == str(tmp_path / "r.json")
    assert (child.net, child.batch, child.precision, child.variant) == ("resnet50", 64, "amp", "wd-pressure")
    assert (child.limit, child.free_bytes, child.wd_total, child.footprint, child.cache, child.iters) == (
        "32MiB", 128 * MiB, "128MiB", 3 * 2**30, "/tmp/own.db", 7)
    assert "--footprint" not in train.child_command(args, dict(row, variant="wr"), args.cache, tmp_path, None)
    with pytest.raises(SystemExit):  # a pressure variant without the footprint's peak
        train.parse_args(train.child_command(args, row, args.cache, tmp_path, None)[2:])


def test_the_childs_environment():
    env = train.child_env({"PYTHONPATH": "/site"})
    assert env["PYTHONPATH"] == f"{train.ROOT}:/site" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert train.child_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native"


def measurements_file(path: Path, rows: int) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE measurements (time_ms REAL)")
        connection.executemany("INSERT INTO measurements VALUES (?)", [(1.0,)] * rows)
        connection.commit()
    return path


def test_own_caches_and_their_state(tmp_path):
    from ucudnn.measure.cache import Cache

    args = train.parse_args(["--out", str(tmp_path)])
    measurements_file(Path(args.cache), 3)
    assert train.variant_cache(args, "alexnet", "fp32", "wr") == args.cache
    footprint = Path(train.variant_cache(args, "alexnet", "fp32", "footprint"))
    assert footprint == tmp_path / "footprint-alexnet-fp32.db" and train.cache_state(footprint) == "warm"
    cold_path = measurements_file(tmp_path / "cold-resnet50-amp.db", 2)  # an earlier run's
    assert train.variant_cache(args, "resnet50", "amp", "wr-cold") == str(cold_path) and not cold_path.exists()
    assert train.cache_state(cold_path) == "empty" and not cold_path.exists()
    assert train.cache_state(measurements_file(tmp_path / "none.db", 0)) == "empty"
    Cache(tmp_path / "new.db")
    assert train.cache_state(tmp_path / "new.db") == "empty"
    (tmp_path / "blank.db").write_bytes(b"")
    assert train.cache_state(tmp_path / "blank.db") == "empty"


def result_row(net: str, precision: str, variant: str, ms: float, **extra) -> dict:
    row = dict(net=net, batch=64, precision=precision, variant=variant, median_ms=ms, peak_mib=1000.0,
               peak_bytes=1000 * MiB, peak_reserved_bytes=1100 * MiB, device_peak_mib=1500.0, first_iter_s=2.0,
               setup_s=0.0)
    return dict(row, cache="warm", **extra) if train.VARIANTS[variant].ucudnn else dict(row, **extra)


def rows_of(times: dict, net: str = "alexnet", precision: str = "fp32") -> list[dict]:
    return [result_row(net, precision, variant, ms) for variant, ms in times.items()]


def failed(variant: str, error: str, net: str = "alexnet", precision: str = "fp32") -> dict:
    return dict(net=net, batch=64, precision=precision, variant=variant, error=error)


def test_pressure_rows_are_skipped_where_the_footprint_failed(tmp_path, monkeypatch):
    calls = []

    def run_variant(args, row, timeout, footprint):
        calls.append((row["net"], row["variant"], footprint))
        if row == dict(net="alexnet", batch=256, precision="fp32", variant="footprint"):
            return dict(row, error="RuntimeError: CUDA out of memory")
        return result_row(row["net"], row["precision"], row["variant"], 10.0, peak_bytes=2 * 2**30)
    monkeypatch.setattr(train, "run_variant", run_variant)
    train.parent(train.parse_args(["--out", str(tmp_path), "--precisions", "fp32", "--variants", "torch,wr-pressure"]))
    rows = json.loads((tmp_path / "train_step.json").read_text())["rows"]
    assert [(r["net"], r["variant"]) for r in rows] == [
        (net, variant) for net in ("alexnet", "resnet50") for variant in ("footprint", "torch", "wr-pressure")]
    assert rows[2]["error"] == "skipped: footprint failed (RuntimeError: CUDA out of memory)"
    assert calls == [("alexnet", "footprint", None), ("alexnet", "torch", None), ("resnet50", "footprint", None),
                     ("resnet50", "torch", None), ("resnet50", "wr-pressure", 2 * 2**30)]
    assert ("| alexnet | fp32 | wr-pressure | - | - | - | - | - | skipped: footprint failed (RuntimeError: "
            "CUDA out of memory) |") in (tmp_path / "train_step.md").read_text()
    assert train.skipped("torch", None, left=29) == "skipped: deadline"
    assert train.skipped("wr-pressure", None, left=100) == "skipped: footprint failed (not run)"


def cells(text: str) -> dict[str, list[str]]:
    """The table's rows by variant, as lists of cells."""
    lines = [line.strip().strip("|").split("|") for line in text.splitlines()[2:]]
    return {cell[2].strip(): [c.strip() for c in cell] for cell in lines}


def test_the_table_takes_speedups_against_the_right_torch():
    wd = dict(blocker_mib=70000.0, footprint_mib=1200.0, free_headroom_mib=64.0, setup_s=3.3,
              ucudnn=dict(kernels=15, micro_batched=9, delegated=0, via_torch=0, fallbacks={}, max_workspace_mib=40.0,
                          wd=[dict(total_workspace=60 * MiB, total_limit=64 * MiB, solve_seconds=0.012)]))
    rows = rows_of({"torch": 10.0, "wr": 12.5, "torch-pressure": 30.0, "wr-pressure": 15.0}) + [
        result_row("alexnet", "fp32", "wd-pressure", 20.0, **wd),
        failed("auto-pressure", "exit code 1: CUDA | out of memory\nTraceback")]
    table = cells(train.table(rows))
    assert [table[v][4] for v in ("torch", "wr", "torch-pressure", "wr-pressure", "wd-pressure")] == [
        "1.00x", "0.80x", "1.00x", "2.00x", "1.50x"]
    assert table["wr"][3:8] == ["12.5", "0.80x", "1000", "1500", "2.0 (warm)"] and table["torch"][7] == "2.0"
    assert table["wd-pressure"][8] == ("blocker 70000 MiB (footprint 1200, 64 MiB free beyond it); 9/15 kernels "
                                       "micro-batched, max ws 40 MiB; WD total 60 of 64 MiB (persistent), solve 12 ms; "
                                       "setup 3.3 s")
    assert table["auto-pressure"][3:] == ["-"] * 5 + ["exit code 1: CUDA / out of memory"]
    assert table["torch"][4] == "1.00x" and cells(train.table(rows[1:]))["wr"][4] == "-"  # no torch: no speedup


def test_findings_state_each_bar():
    rows = (rows_of({"torch": 10.0, "wr": 10.2, "torch-pressure": 30.0, "wr-pressure": 15.0})
            + rows_of({"torch": 20.0, "wr": 21.0, "torch-pressure": 20.0, "wr-pressure": 19.0, "wd-pressure": 21.0},
                      "resnet50", "amp") + [failed("auto-pressure", "exit code 1", "resnet50", "amp")])
    notes = train.findings(rows)
    assert len(notes) == 1 + 3 * 3 + 2 and sum("(memory free)" in n for n in notes) == 2
    for expected in ("(pressure): alexnet fp32 wr-pressure vs torch-pressure: 2.00x (PASS, needs >= 1.5x)",
                     "(pressure): resnet50 amp wr-pressure vs torch-pressure: 1.05x (PASS, needs >= 1.0x)",
                     "(pressure): resnet50 amp wd-pressure vs torch-pressure: 0.95x (FAIL, needs >= 1.0x)",
                     "(pressure): resnet50 amp auto-pressure vs torch-pressure: not evaluated (auto-pressure: exit code 1)",
                     "(pressure): resnet50 fp32 wr-pressure vs torch-pressure: not evaluated (wr-pressure: not run; "
                     "torch-pressure: not run)",
                     "(memory free): alexnet fp32 wr vs torch: 0.98x (PASS, needs >= 0.97x)",
                     "(memory free): resnet50 amp wr vs torch: 0.95x (FAIL, needs >= 0.97x)"):
        assert f"Bar {expected}" in notes
    slow = rows_of({"torch-pressure": 30.0, "wr-pressure": 21.0})
    assert "1.43x (FAIL, needs >= 1.5x)" in train.findings(slow)[0]


# --- memory_overhead.py ------------------------------------------------------------------------------

def test_memory_overhead_reports_each_phases_growth_and_failed_variants():
    memory = _load("memory_overhead")
    phases = [dict(phase="torch step (no benchmark)", outside_mib=766.8, reserved_mib=2248),
              dict(phase="legacy handle", outside_mib=776.8, reserved_mib=2248),
              dict(phase="first iteration", outside_mib=800.8, reserved_mib=2616),
              dict(phase="cupy pool", outside_mib=0.0, reserved_mib=None)]  # not a device phase
    lines = memory.table([dict(variant="wr", phases=phases, cudnn_handles={"cuda:0": "torch's"}),
                          dict(variant="wr-direct", error="Traceback ... OOM")])
    rows = {line.split(" | ")[1]: line for line in lines.splitlines()[2:]}
    assert "| 766.8 |  | 2248 |" in rows["torch step (no benchmark)"]  # the baseline: no growth
    assert "| +10.0 |" in rows["legacy handle"] and "| +24.0 |" in rows["first iteration"]
    assert rows["cupy pool"].endswith("| 0.0 |  |  |")
    assert "| wr | cuDNN handle on cuda:0: torch's | | | |" in lines
    assert "| wr-direct | error | Traceback ... OOM" in lines
    assert set(memory.VARIANTS) == {"torch", "wr", "wr-direct", "wr-legacy", "wr-engines"}
    assert memory.VARIANTS["wr-direct"] == (True, {"UCUDNN_EXECUTION": "direct"})


def test_train_step_notes_name_allocator_churn_and_memory_outside_torch():
    row = dict(allocator_per_iter=dict(num_alloc_retries=2.9, num_device_alloc=8.4), outside_mib=791.2)
    assert train.notes_of(row) == ("allocator per iteration: 2.9 retries, 8.4 device allocations; "
                                   "791 MiB outside torch's pool")
    assert train.notes_of(dict(allocator_per_iter=dict(num_alloc_retries=0.0, num_device_alloc=0.0))) == ""


# --- train_ab ------------------------------------------------------------------------------------------

ab = _load("train_ab")
AB_META = dict(gpu="GPU", torch="2", cudnn=91900, limits="64MiB", rounds=3, iters=10)


def ab_row(net="alexnet", precision="fp32"):
    iterations = {"torch": [[10.0, 10.0], [14.0, 10.0], [11.0, 11.0]],
                  "ucudnn@64MiB": [[10.0, 6.0], [14.0, 10.0], [11.0, 11.0]],
                  "control": [[10.0, 10.0], [10.0, 10.0], [11.0, 11.0]]}
    summary = dict(kernels=14, delegated=12, micro_batched=1)
    note = ab.kernels_note(summary, dict(replays=30, captures=2, direct_runs=1))
    watched = {name: [dict(peak_mib=1000.0 + i, retries=i) for i in range(3)] for name in iterations}
    return ab.summarise(net, 256, precision, iterations, {"ucudnn@64MiB": note}, {}, watched)


class Mark:
    """A CUDA event's stand-in: recorded at a fake clock's time."""

    clock = 0.0

    def __init__(self):
        self.at = Mark.clock

    def elapsed_time(self, other):
        return other.at - self.at


def test_ab_variants_take_turns_and_every_iteration_is_timed():
    calls = []

    def step(name, ms):
        def run():
            calls.append(name)
            Mark.clock += ms
        return run
    marks = ab.interleave({"torch": step("t", 2.0), "ucudnn": step("u", 3.0), "control": step("c", 1.0)},
                          rounds=4, iters=2, mark=Mark)
    assert "".join(calls) == "ttuucc" + "uucctt" + "ccttuu" + "ttuucc"
    assert ab.iteration_ms(marks) == {"torch": [[2.0, 2.0]] * 4, "ucudnn": [[3.0, 3.0]] * 4,
                                      "control": [[1.0, 1.0]] * 4}


def test_ab_ratios_are_torch_over_the_variant_round_by_round():
    variants = ab_row()["variants"]
    ours, control = variants["ucudnn@64MiB"], variants["control"]
    assert variants["torch"]["rounds_ms"] == [10.0, 12.0, 11.0] and ours["rounds_ms"] == [8.0, 12.0, 11.0]
    assert [variants[name]["median_ms"] for name in variants] == [11.0, 11.0, 10.0]
    assert (ours["first_ms"], ours["rest_ms"]) == (11.0, 10.0)
    assert ours["ratio"] == {"median": 1.0, "min": 1.0, "max": 1.25}
    assert control["ratio"] == {"median": 1.0, "min": 1.0, "max": 1.2}
    assert variants["torch"]["ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert ours["note"] == "12/14 delegated, 1 micro-batched; 30 replays, 2 captures, 1 direct"
    table = ab.markdown(AB_META, [ab_row()])
    assert (ours["peak_mib"], ours["retries_per_iter"]) == (1002.0, 0.5)  # the highest peak; 3 retries / 6 iterations
    assert "| ucudnn@64MiB | 11.00 | 1.000 (1.000-1.250) | 11.00 / 10.00 | 1002 | 0.5 | 12/14 " in table
    assert "| alexnet B=256 | fp32 | control | 10.00 | 1.000 (1.000-1.200) | 10.00 / 10.00 | 1002 | 0.5 |  |" in table
    assert table.count("Memory free;") == 1
    failed = dict(net="resnet50", batch=64, precision="amp", error="OutOfMemoryError: CUDA out of memory")
    table = ab.markdown(dict(AB_META, free="64MiB"), [failed])
    assert "leaves" not in table and "copies' own peak + 64MiB" in table
    assert "| resnet50 B=64 | amp | failed | | | | | | OutOfMemoryError: CUDA out of memory |" in table


class FakeWatch:
    def __init__(self):
        self.seen = []

    def begin(self, name):
        self.seen.append(f"begin {name}")

    def end(self, name):
        self.seen.append(name)


def test_ab_watch_sees_every_round_begin_and_end_in_turn():
    watch = FakeWatch()
    ab.interleave({"torch": lambda: None, "ucudnn": lambda: None}, rounds=2, iters=3, mark=Mark, watch=watch)
    assert watch.seen == ["begin torch", "torch", "begin ucudnn", "ucudnn", "begin ucudnn", "ucudnn",
                          "begin torch", "torch"]


def test_ab_limits_name_wr_wd_and_auto_copies_and_bad_ones_fail_before_the_gpu():
    x = object()
    assert ab.convert_keywords("64MiB", x) == dict(workspace_limit="64MiB")
    assert ab.convert_keywords("wd:64MiB", x) == dict(optimizer="wd", total_limit="64MiB", sample_input=x)
    assert ab.convert_keywords("wd:auto", x) == dict(optimizer="wd", total_limit="auto")
    assert list(ab.copies("model", ["64MiB", "wd:auto"])) == ["torch", "ucudnn@64MiB", "ucudnn@wd:auto", "control"]
    assert list(ab.copies("model", ["64MiB"], control=False)) == ["torch", "ucudnn@64MiB"]
    assert ab.parse_args(["--out", "o"]).control and not ab.parse_args(["--out", "o", "--no-control"]).control
    args = ab.parse_args(["--out", "o", "--limits", "64MiB,wd:32MiB,wd:auto", "--free", "96MiB"])
    assert args.free_bytes == 96 * 2**20 and ab.parse_args(["--out", "o"]).free_bytes == 0
    with pytest.raises(ValueError, match="write SIZE"):
        ab.parse_args(["--out", "o", "--limits", "wr:64MiB"])
    with pytest.raises(Exception, match="--limits"):
        ab.parse_args(["--out", "o", "--limits", "wd:lots"])


def test_ab_configs_and_the_run_writes_after_each_and_stops_at_the_deadline(tmp_path):
    assert ab.configs("alexnet:256,resnet50:64", "fp32,amp") == [
        ("alexnet", 256, "fp32"), ("alexnet", 256, "amp"), ("resnet50", 64, "fp32"), ("resnet50", 64, "amp")]
    rows = ab.measure_all(ab.configs("alexnet:256", "fp32,amp"), lambda n, b, p: ab_row(n, p), AB_META, tmp_path, 1e6)
    assert [r["precision"] for r in rows] == ["fp32", "amp"]
    assert len(json.loads((tmp_path / "train_ab.json").read_text())["rows"]) == 2
    assert "| alexnet B=256 | amp | torch |" in (tmp_path / "train_ab.md").read_text()
    assert ab.measure_all(ab.configs("alexnet:256", "fp32"), lambda *c: pytest.fail("measured"), AB_META,
                          tmp_path, -1) == []


def test_ab_a_copy_out_of_memory_in_warm_up_is_left_out_and_the_others_go_on():
    torch = pytest.importorskip("torch", reason="warm_up catches torch's out-of-memory error")

    calls = []

    def step(name, fails_at=None):
        def run():
            calls.append(name)
            if calls.count(name) == fails_at:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 44.00 MiB.\nmore")
            return 2.0
        return run
    losses, failed = ab.warm_up({"torch": step("t"), "ucudnn@64MiB": step("u", fails_at=2), "control": step("c")}, 3)
    assert "".join(calls) == "tuc" + "tuc" + "tc"
    assert losses == {"torch": 2.0, "ucudnn@64MiB": 2.0, "control": 2.0}
    assert failed == {"ucudnn@64MiB": "warm-up iteration 2: CUDA out of memory. Tried to allocate 44.00 MiB."}
    row = dict(ab_row(), failed=failed)
    assert ("| alexnet B=256 | fp32 | ucudnn@64MiB | failed | | | | | warm-up iteration 2: CUDA out of memory."
            in ab.markdown(AB_META, [row]))


def test_ab_a_failed_config_is_a_row_and_the_next_one_runs(tmp_path):
    def measure(net, batch, precision):
        if precision == "fp32":
            raise RuntimeError("CUDA out of memory. Tried to allocate 138.00 MiB")
        return ab_row(net, precision)
    rows = ab.measure_all(ab.configs("alexnet:256", "fp32,amp"), measure, AB_META, tmp_path, 1e6)
    assert rows[0]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 138.00 MiB"
    assert rows[1]["precision"] == "amp" and "variants" in rows[1]


def test_cold_models_bars_and_table():
    import cold_models as cm
    torch = pytest.importorskip("torch", reason="the gradient error is computed on torch tensors")

    assert cm.relative_error(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 2.0])) == pytest.approx(1 / 5**0.5)
    torch_run, cold = {"first_s": 10.0}, {"first_s": 25.0, "grads": {"worst": 0.02, "control_worst": 0.01},
                                           "summary": {"planning_s": 12.0, "swept": 9, "unswept": 40}}
    warm = {"first_s": 11.5, "steady": {"torch_over_ucudnn": 0.98, "torch_over_control": 1.0}}
    v = cm.verdicts(torch_run, cold, warm, {"pruned_ms": 10.4, "full_ms": 10.0}, "8MiB")
    assert v["first_ratio"] == 2.5 and v["first_ok"] and v["warm_ok"] and v["grads_ok"] and v["steady_ok"]
    assert v["pruned_over_full"] == pytest.approx(1.04) and v["pruned_ok"]
    v = cm.verdicts(torch_run, cold, {"first_s": 12.5}, {"pruned_ms": 10.6, "full_ms": 10.0}, "64MiB")
    assert not v["first_ok"] and not v["warm_ok"] and not v["pruned_ok"] and "steady_ok" not in v
    assert cm.verdicts({}, {}, {}, None, "8MiB") == {"first_ratio": None, "first_ok": None, "warm_ok": None}
    table = cm.markdown([{"model": "resnet50d", "limit": "8MiB", "torch": torch_run, "cold": cold, "warm": warm,
                          "verdicts": v}])
    assert "| resnet50d | 8MiB | 10.0 | 25.0 | 2.50 | 12.5 |" not in table and "| 9 / 40 |" in table


def test_cold_models_finds_every_conv_kernel_without_running_one():
    """--timed times torch's kernels of every conv: found on the meta device, F, BD and BF each,
    in the precision and layout the model trains in; a row of --timed has no table line."""
    import cold_models as cm
    torch = pytest.importorskip("torch", reason="the kernels are found through a torch model")

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, stride=2, groups=2), torch.nn.Conv2d(8, 8, 3, padding="same"))
    problems = cm.conv_problems(model, torch.randn(5, 3, 16, 16), amp=True)
    assert sorted(str(p.kind) for p in problems) == ["BD", "BD", "BF", "BF", "F", "F"]  # "same" left out
    second = next(p for p in problems if p.groups == 2)
    assert second.x_shape == (5, 8, 16, 16) and second.strides == (2, 2) and second.layout == "nhwc"
    assert {p.dtype for p in problems} == {"float16"}
    assert cm.markdown([{"model": "resnet50", "torch": {}, "timed": {"first_s": 1.0}}]).count("\n") == 2


def test_cold_models_steady_state_turns_one_model_between_ucudnn_and_torch():
    import cold_models as cm
    torch = pytest.importorskip("torch", reason="the layers are torch modules")

    class Marked(torch.nn.Conv2d):
        pass
    convs = [Marked(2, 2, 1), Marked(2, 2, 3)]
    seen = []
    step = lambda: seen.append({type(m) for m in convs})  # noqa: E731
    cm.as_class(convs, torch.nn.Conv2d, step)()
    cm.as_class(convs, Marked, step)()
    assert seen == [{torch.nn.Conv2d}, {Marked}]


def test_cold_models_times_each_steps_host_calls_and_profiles_them():
    import cold_models as cm

    calls = []
    timed, host = cm.host_timed({"a": lambda: calls.append("a"), "b": lambda: time.sleep(0.01)})
    timed["a"](), timed["b"](), timed["b"]()
    assert calls == ["a"] and len(host["a"]) == 1 and len(host["b"]) == 2 and min(host["b"]) >= 0.009
    profile = cm.host_profile({"b": lambda: time.sleep(0.001)}, iters=3, top=5)
    assert len(profile["b"]) == 5 and any("sleep" in line for line in profile["b"])


def test_cold_models_gives_each_process_empty_jit_caches_unless_shared(tmp_path):
    import argparse

    import cold_models as cm

    first, second = (cm.jit_caches(argparse.Namespace(jit_cache="fresh")) for _ in range(2))
    assert set(first) == {"CUDA_CACHE_PATH", "CUPY_CACHE_DIR"} and first["CUDA_CACHE_PATH"] != second["CUDA_CACHE_PATH"]
    assert not list(Path(first["CUDA_CACHE_PATH"]).iterdir())
    assert cm.jit_caches(argparse.Namespace(jit_cache="shared")) == {}


def test_nd_layers_bars_and_table():
    import nd_layers as nd

    row = {"layer": "unet3d", "input": [2, 64, 64, 64, 64], "precision": "fp32", "free_mib": 64.0,
           "torch_free_ms": 3.3, "torch_pressure_ms": 15.0, "control_pressure_ms": 15.3, "ucudnn_ms": 4.0,
           "ucudnn_errors": {"dw": 5e-5}, "torch_errors": {"dw": 4e-5}}
    v = nd.verdicts(row)
    assert v["torch_loses"] and v["speedup"] == pytest.approx(3.75) and v["speedup_ok"] and v["near_free_ok"] is True
    assert v["no_slower_ok"] and v["grads_ok"]
    fine = dict(row, torch_pressure_ms=3.4, control_pressure_ms=3.3, ucudnn_ms=3.6, ucudnn_errors={"dw": 1e-3})
    v = nd.verdicts(fine)  # torch does not lose: no speedup bar; 6% slower beyond a 3% A/A spread; dW too far
    assert not v["torch_loses"] and "speedup_ok" not in v and not v["no_slower_ok"] and not v["grads_ok"]
    # torch's step took 40 MiB of workspace at 8 MiB free: ucudnn given as much is judged too
    alike = dict(row, free_mib=8.0, ucudnn_ms=16.0, torch_workspace_mib=40.0, ucudnn_alike_ms=14.0)
    va = nd.verdicts(alike)
    assert not va["no_slower_ok"] and va["alike_speedup"] == pytest.approx(15 / 14) and va["alike_ok"]
    assert not nd.verdicts(dict(alike, ucudnn_alike_ms=16.0))["alike_ok"]
    assert "alike_ok" not in v and "kernels_ms" not in v
    # the plans at L bound what any split within L reaches: here below 2x however it is run
    plans = [{"via": "ucudnn", "predicted_ms": 2.7, "own_ms": math.inf}, {"via": "torch", "own_ms": 4.8}]
    vp = nd.verdicts(dict(alike, plans=plans))
    assert vp["kernels_ms"] == pytest.approx(7.5) and vp["reachable_speedup"] == pytest.approx(2.0)
    table = nd.markdown([dict(row, verdicts=nd.verdicts(row)), dict(fine, verdicts=v), dict(alike, verdicts=va),
                         {"layer": "c3d_conv1", "input": [16, 3, 16, 112, 112], "precision": "fp32", "error": "out of memory"}])
    assert "| **unet3d** |" in table and "| unet3d |" in table and "no_slower FAILED" in table
    assert "| 40 MiB: 14.00 (1.07x) |" in table and "alike," in table
    assert "out of memory" in table and all(line.count("|") == 14 for line in table.splitlines())
    assert set(nd.LAYERS) >= {"c3d_conv1", "unet3d_fp16", "dcgan_up", "audio_conv1d"}


def test_nd_layers_runs_each_row_in_a_process_of_its_own_and_keeps_its_failures(monkeypatch, capsys):
    import subprocess

    import nd_layers as nd

    done = []

    def run(command, **kwargs):
        done.append(command)
        row = command[command.index("--row") + 1]
        if row.startswith("unet3d:"):
            raise subprocess.TimeoutExpired(command, kwargs["timeout"])
        if row.startswith("dcgan_up:"):
            return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nRuntimeError: boom\n")
        return subprocess.CompletedProcess(command, 0, 'a log line\n{"layer": "c3d_conv1", "ucudnn_ms": 1.0}\n', "")
    monkeypatch.setattr(nd.subprocess, "run", run)
    assert nd.in_child("c3d_conv1", "8MiB", "db", 30) == {"layer": "c3d_conv1", "ucudnn_ms": 1.0}
    assert "a log line" in capsys.readouterr().err  # the child's log goes on, its result line is the row
    assert nd.in_child("unet3d", "8MiB", "db", 30)["error"] == "no result within 30 s"
    failed = nd.in_child("dcgan_up", "64MiB", "db", 30)
    assert failed["error"] == "exit 1: RuntimeError: boom" and failed["input"] == list(nd.LAYERS["dcgan_up"][2])
    assert all(c[c.index("--row") + 1].split(":")[0] in nd.LAYERS for c in done)


def test_streams_bars_and_table():
    import streams

    row = {"model": "googlenet", "batch": 1, "one_stream_ms": 1.07, "streams_ms": 0.61, "predicted_ms": 0.5}
    v = streams.verdicts(row)
    assert v["speedup"] == pytest.approx(1.07 / 0.61) and v["floor"] == 1.5 and v["ok"]
    assert streams.verdicts(dict(row, batch=32, streams_ms=0.95))["floor"] == 1.2
    other = streams.verdicts(dict(row, model="resnet50", streams_ms=1.1))  # slower: below the no-slower floor
    assert other["floor"] == streams.NO_SLOWER and not other["ok"]
    table = streams.markdown([dict(row, verdicts=v), {"model": "inception_v3", "batch": 8, "error": "TraceError"}],
                             {"serial_ms": 80.0, "concurrent_ms": 75.0, "speedup": 80 / 75, "control": 1.0,
                              "graph_serial_ms": 70.0, "graph_concurrent_ms": 70.0, "graph_speedup": 1.0,
                              "graph_control": 1.0})
    assert ">= 1.50: met" in table and "TraceError" in table and "(1.067x, bar 1.05x: met)" in table
    assert "(1.000x, bar 1.05x: NOT met)" in table and "With delegation on" not in table
    delegated = {"serial_ms": 80.0, "concurrent_ms": 75.0, "speedup": 80 / 75, "control": 1.0, "graph_serial_ms": 70.0,
                 "graph_concurrent_ms": 70.0, "graph_speedup": 1.0, "graph_control": 1.0,
                 "eager_serial_delegated_ms": 15.0, "eager_concurrent_delegated_ms": 14.0,
                 "graph_serial_delegated_ms": 8.0, "graph_concurrent_delegated_ms": 7.9}
    assert ("eager serial 15.00 ms, concurrent 14.00 ms (1.071x); graph serial 8.00 ms, concurrent 7.90 ms (1.013x)"
            in streams.markdown([], delegated))
    equal = streams.markdown([dict(row, verdicts=v, equal_priority_ms=0.535, ceiling={2: 1.3, 4: 1.412})], None)
    assert ">= 1.50: met | 0.535 (2.00x) | 2: 1.30x, 4: 1.41x | - |" in equal and "| - | - | - |" in table  # none: -
    assert all(line.count("|") == 11 for line in (table + equal).splitlines() if line.startswith("|"))
    assert "| outputs 2.0e-03 |" in streams.markdown([dict(row, verdicts=v, output_difference=2e-3)], None)
    assert "| gradients inf |" in streams.markdown([dict(row, verdicts=v, grad_difference=float("inf"))], None)
    assert "| gradients 3.0e-03 (A/A 2.0e-03) |" in streams.markdown(
        [dict(row, verdicts=v, grad_difference=3e-3, grad_differences={"control": 2e-3, "streams": 3e-3})], None)
    training = dict(row, step="training", batch=32, streams_ms=0.85)
    assert streams.verdicts(training)["floor"] == streams.TRAINING_BAR and streams.verdicts(training)["ok"]
    beside = dict(training, verdicts=streams.verdicts(training), bf_beside_bd_ms=1.0, streams_bf_beside_bd_ms=0.8,
                  used_streams=4, delegated_kernels=171, kernels=171)
    assert ("googlenet training B=32, converted with BF beside BD in every layer's backward (171 of 171 kernels "
            "delegated to torch): one stream 1.000 ms (1.070x), 4 streams 0.800 ms (1.337x)") in streams.markdown([beside], None)


def test_streams_ceiling_is_copies_times_one_over_the_copies_side_by_side(monkeypatch):
    import streams

    times = {"one_stream_ms": 6.0, "streams_ms": 5.0, "equal_priority_ms": 5.5, "copies_2_ms": 10.0,
             "copies_4_ms": 20.0}
    monkeypatch.setattr(streams, "replay_ms", lambda replays: {name: times[name] for name in replays})
    plan = SimpleNamespace(makespan_ms=4.0, critical_ms=3.0, placements={"a": 0}, streams=4)
    row = streams.timed_row({"model": "inception_v3", "batch": 32}, "one", "many", plan, "equal",
                            {2: "two", 4: "four"})
    assert row["ceiling"] == {2: pytest.approx(1.2), 4: pytest.approx(1.2)}
    assert row["verdicts"]["speedup"] == pytest.approx(1.2) and row["verdicts"]["ok"]
    assert streams.timed_row({"model": "alexnet", "batch": 1}, "one", "many", plan, "equal")["ceiling"] == {}


def test_streams_differences_are_relative_norms_and_inf_where_not_finite():
    torch = pytest.importorskip("torch")
    import streams

    want = torch.tensor([3.0, 4.0])
    assert streams.relative_difference(torch.tensor([3.0, 4.5]), want) == pytest.approx(0.1)
    assert streams.relative_difference(torch.tensor([float("nan"), 4.0]), want) == float("inf")
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for module in (a, b):
        for p in module.parameters():
            p.grad = torch.ones_like(p)
    b.bias.grad = torch.full_like(b.bias, 1e-6)  # a tiny gradient, wholly off (a.bias's is 1) ...
    # ... weighs what it holds in all six: a per-parameter maximum would say 1e6
    assert streams.gradient_difference(a, b) == pytest.approx((2 * (1 - 1e-6) ** 2 / (4 + 2e-12)) ** 0.5)


def test_carveout_ways_sums_and_table():
    import carveout

    ways = carveout.ways([44, 66, 200], 132, [32])
    assert ways == [("serial", None, None), ("concurrent", None, None), ("carved 44/88", 44, 88),
                    ("carved 66/66", 66, 66), ("BF on 32", None, 32)]  # a share of all or more is no carveout
    rows = [{"layer": "a", "count": 2, "ms": {"serial": 1.0, "concurrent": 0.8, "carved 66/66": 0.9},
             "plans": {"BD 132": {"listed": 40, "plan": "eng1"}}},
            {"layer": "b", "count": 1, "ms": {"serial": 1.0, "concurrent": 1.2, "carved 66/66": 0.7},
             "plans": {"BD 66": {"listed": 18, "plan": "eng2", "error": 0.0}}}]
    total = carveout.summed(rows)
    assert total["ms"] == {"serial": 3.0, "concurrent": pytest.approx(2.8), "carved 66/66": pytest.approx(2.5)}
    assert total["best_ms"] == pytest.approx(2 * 0.8 + 0.7)  # each layer its fastest way
    assert total["speedup"]["concurrent"] == pytest.approx(3 / 2.8) and total["best_speedup"] == pytest.approx(3 / 2.3)
    table = carveout.markdown(rows, total)
    assert "| a | 2 | 1.000 | 0.800 | 0.900 | BD 132 40 |" in table and "each layer its fastest way 1.304x" in table
    assert carveout.summed([]) == {"ms": {}, "best_ms": 0}


def test_module_path_counts_modules_changes_and_reentries():
    import module_path as mp

    got = mp.summary(["ucudnn.cli", "ucudnn.plan.config", "ucudnn.cli", "ucudnn.reports.report"], 7)
    assert (got["modules"], got["changes"], got["reentries"], got["functions"]) == (3, 3, 1, 7)
    assert got["path"] == ["cli", "plan.config", "cli", "reports.report"]
    from ucudnn.plan import config

    path, functions = mp.first_call_path(lambda: [config.parse_size("8MiB") for _ in range(3)])
    assert path and set(path) <= {"ucudnn.plan.config", "ucudnn.core.errors"} and functions >= 1


def test_module_path_follows_a_converted_models_first_step_through_the_planner():
    pytest.importorskip("torch")
    import module_path as mp

    mp.import_all(torch_integration=True)
    path, functions = mp.first_call_path(mp.converted_step())
    assert path[0] == "ucudnn.integrations.torch.layers"
    assert {"ucudnn.integrations.torch.context", "ucudnn.plan.assignment", "ucudnn.plan.solve", "ucudnn.optimizers.wr",
            "ucudnn.execute.dispatch"} <= set(path) and functions > 100


def test_each_tests_seconds_are_kept_as_it_ends_where_asked(tmp_path, monkeypatch):
    """conftest's hook: a GPU run cut by its time limit still says where its time went."""
    import types

    import conftest

    report = types.SimpleNamespace(duration=1.234, when="call", outcome="passed", nodeid="tests/t.py::test_a")
    monkeypatch.delenv("UCUDNN_TEST_TIMES", raising=False)
    conftest.pytest_runtest_logreport(report)  # not asked: writes nothing
    times = tmp_path / "times.tsv"
    monkeypatch.setenv("UCUDNN_TEST_TIMES", str(times))
    conftest.pytest_runtest_logreport(report)
    conftest.pytest_runtest_logreport(types.SimpleNamespace(**{**vars(report), "nodeid": "tests/t.py::test_b"}))
    assert times.read_text().splitlines() == ["1.23\tcall\tpassed\ttests/t.py::test_a", "1.23\tcall\tpassed\ttests/t.py::test_b"]


def test_streams_layer_pairs_sum_each_layer_the_faster_way():
    import streams

    rows = [{"layer": "Conv2d(64, 64)", "input": [32, 64, 56, 56], "count": 3, "serial_ms": 1.0, "concurrent_ms": 0.8,
             "control_ms": 1.0},
            {"layer": "Conv2d(512, 512)", "input": [32, 512, 7, 7], "count": 2, "serial_ms": 0.5, "concurrent_ms": 0.6,
             "control_ms": 0.5}]
    total = streams.selective(rows)
    assert total["serial_ms"] == pytest.approx(4.0) and total["concurrent_ms"] == pytest.approx(3.6)
    assert total["selective_ms"] == pytest.approx(3.4) and total["selective_speedup"] == pytest.approx(4.0 / 3.4)
    assert total["faster_concurrent"] == 1 and total["layers"] == 2
    table = streams.pairs_markdown(rows, total)
    assert "| 1.25x |" in table and "| 0.83x |" in table and "(1.176x; 1 of 2 layers concurrent)" in table
