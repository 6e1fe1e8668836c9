"""CPU tests of bench/torch_shapes.py and bench/cold_start.py: shapes, verdicts, bookkeeping,
tables and milestone parsing, and one shape measured end to end on the CPU (a NumPy backend in
place of cuDNN, perf_counter in place of CUDA events). Their GPU runs are bench/gpu_suite.sh's
`shapes` and `coldstart` stages."""
from __future__ import annotations

import copy
import importlib.util
import json
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


def test_rounds_alternate_who_goes_first_and_report_ms_per_step():
    calls = []

    def time_loop(loop):
        loop()
        return 10.0  # ms for the whole loop
    times = shapes.alternate_rounds({"torch": lambda: calls.append("t"), "ucudnn": lambda: calls.append("u")},
                                    time_loop, rounds=3, steps=2)
    assert times == {"torch": [5.0] * 3, "ucudnn": [5.0] * 3}
    assert "".join(calls) == "ttuu" + "uutt" + "ttuu"
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
    times = {"torch": [torch_ms, torch_ms * 1.01], "ucudnn": [ucudnn_ms] * 2}
    return shapes.result_row(spec, times, {"y": 1e-4, "dw": dw_error}, SUMMARY, 0.5)


def test_result_row_and_its_table_row():
    row = make_row()
    assert row["ratio"] == pytest.approx(1.005 / 0.9) and row["verdict"] == "PASS" and row["correct"]
    assert row["error_limits"] == {"y": 2e-2, "dw": 4e-2}  # amp; BF ran in 2 parts
    assert shapes.table_row(row) == ("| 0 | grouped | B=37 32->64 k3 s2 p1 d1 g4 56x56 bias | amp | 1.005 | 0.900 | "
                                     "1.117 | PASS | ok dw 1.0e-03 (4.0e-02) | ucudnn F(1) BF(2); torch BD |")
    assert shapes.table_row(row).count("|") == shapes.TABLE_HEAD.splitlines()[0].count("|")
    assert "WRONG dw" in shapes.table_row(make_row(dw_error=0.5))
    error = dict(layer=row["layer"], shape=row["shape"], error="RuntimeError: out of memory\nmore")
    assert shapes.table_row(error).endswith("| ERROR | - | RuntimeError: out of memory |")


def test_findings_state_the_bar_over_what_was_measured():
    passing = shapes.findings([make_row(0), make_row(1, ucudnn_ms=1.0)], planned=2)
    assert passing[0].startswith("Bar") and ": PASS on 2 of 2" in passing[0]
    slow = shapes.findings([make_row(0), make_row(1, ucudnn_ms=1.2)], planned=3)
    assert ": FAIL on 2 of 3" in slow[0] and "1 slower" in slow[0] and "1 not reached" in slow[0]
    assert "#1" in slow[1]  # the worst shape
    wrong = shapes.findings([make_row(0, dw_error=1.0)], planned=1)
    assert ": FAIL" in wrong[0] and "WRONG #0" in wrong[-1]
    assert ": FAIL on 0 of 4" in shapes.findings([], planned=4)[0]


def test_out_of_time_keeps_room_for_the_slowest_shape():
    assert shapes.out_of_time(9.0, []) and not shapes.out_of_time(11.0, [])
    assert shapes.out_of_time(20.0, [4.0, 14.0]) and not shapes.out_of_time(22.0, [4.0, 14.0])


def test_arguments_and_their_defaults(tmp_path):
    args = shapes.parse_args(["--out", str(tmp_path)])
    assert (args.count, args.seed, args.limit, args.steps, args.rounds) == (24, 0, "4GiB", 50, 5)
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
    from torch_doubles import NumpyBackend
    from ucudnn.cache import Cache

    def convert_copy(module):
        context = ut.Context(backend=NumpyBackend(), cache=Cache(tmp_path / "bench.db"), workspace_limit="64KiB")
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


@pytest.mark.parametrize("action", ["bench", "optimize"])
def test_the_sweep_commands_are_ones_the_cli_accepts(action):
    from ucudnn.cli import build_parser

    command = cold.cli_command(action, COLD_ARGS)
    assert command[1:3] == ["-m", "ucudnn"]
    args = build_parser().parse_args(command[3:])
    assert (args.command, args.net, args.batch, args.dtype, args.policy, args.backend, args.cache, args.json) == (
        action, "torchvision:alexnet", 256, "float32", "powerOfTwo", "engines", "/tmp/cold.db", True)
    if action == "optimize":
        assert args.workspace == 64 * 2**20


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


def sweep_records(bench_s: float = 41.0) -> tuple[dict, dict]:
    plan = {"kernels": [{"configuration": {"micro": [{}, {}]}}, {"configuration": {"micro": [{}]}}],
            "total": {"time_ms": 12.5}}
    return (dict(wall_s=bench_s + 4, document={"seconds": bench_s, "kernels": 15, "sizes": [1, 2, 256]}),
            dict(wall_s=3.0, document=plan))


def cold_report(bench_s: float = 41.0, child_out: str = CHILD_OUT) -> dict:
    return dict(batch=256, limit="64MiB", backend="engines", sweep=cold.sweep_summary(*sweep_records(bench_s)),
                second_process=cold.first_iteration_summary(dict(wall_s=4.3, stdout=child_out)),
                rows_after_sweep=1000, rows_added_by_second_process=0, cudnn_versions=[91900])


def test_sweep_summary_adds_the_two_processes():
    sweep = cold.sweep_summary(*sweep_records())
    assert sweep["total_s"] == 48.0 and sweep["bench_measuring_s"] == 41.0
    assert sweep["planned_micro_batched"] == 1 and sweep["planned_ms"] == 12.5 and sweep["errors"] == []
    timed_out = cold.sweep_summary(dict(wall_s=120.2, error="timed out after 120 s"), dict(wall_s=None))
    assert timed_out["total_s"] is None and timed_out["errors"] == ["timed out after 120 s"]


def test_verdicts_and_report():
    notes = cold.verdicts(cold_report())
    assert notes[0].startswith("Bar (a)") and "48.0 s (PASS" in notes[0] and "measuring 41.0 s" in notes[0]
    assert "4.10 s (PASS)" in notes[1] and notes[2] == "(b) dominated by: import torch (1.17 s)"
    assert "(FAIL" in cold.verdicts(cold_report(bench_s=70.0))[0]
    unsplit = CHILD_OUT.replace('"micro_batched": 9', '"micro_batched": 0')
    assert "no kernel was micro-batched" in cold.verdicts(cold_report(child_out=unsplit))[1]
    crashed = cold_report(child_out=CHILD_OUT.split("\n")[0])
    crashed["second_process"]["error"] = "exit code 1"
    assert cold.verdicts(crashed)[1] == "Bar (b): not reached (exit code 1)"
    text = cold.markdown(cold_report())
    assert "| first iteration | 4.100 | 0.700 |" in text and "cuDNN versions in it: [91900]" in text


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
