"""The benchmarks of bench/ on the CPU: each script imports from the repository root (no
sys.path edits) and parses the flags docs/results.md's commands use; bench.common's pure parts
(variants in turns, the blocker's size, a child's environment). Their GPU runs are
bench/gpu_suite.sh's stages."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import types
from pathlib import Path

import pytest

from bench import common

BENCH = Path(__file__).resolve().parents[1] / "bench"
MiB = 2**20
# script: flags its --help must name (those docs/results.md's commands use)
SCRIPTS = {
    "layers": ["--nets", "--limits", "--policies", "--execution", "--dtype", "--layout", "--no-overhead", "--cache"],
    "record": ["--out", "--specs", "--execution", "--backend"],
    "pressure": ["--models", "--limits", "--iters", "--rounds", "--need", "--profile-steady", "--variants", "--explain"],
    "streams": ["--models", "--batches", "--streams", "--training", "--copies", "--no-backward"],
    "nd_layers": ["--limits", "--layers", "--deadline"],
    "train_ab": ["--nets", "--precisions", "--limits", "--rounds", "--iters", "--no-control"],
    "zero_cost": ["--sections"],
    "cold_models": ["--models", "--limits", "--torch-runs", "--no-full"],
    "largest_batch": ["--models", "--need", "--iters", "--cap", "--deadline"],
    "host_path_cpu": ["--calls", "--profile"],
}


def test_no_script_edits_sys_path():
    for script in BENCH.glob("*.py"):
        assert "sys.path" not in script.read_text(), script.name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_imports_and_parses_its_documented_flags(name):
    if name in ("zero_cost", "streams", "nd_layers"):
        pytest.importorskip("torch")
    script = importlib.import_module(f"bench.{name}")
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit) as done:
        script.main(["--help"])
    assert done.value.code == 0
    for flag in SCRIPTS[name]:
        assert flag in text.getvalue(), (name, flag)


def test_env_report_imports():
    assert callable(importlib.import_module("bench.env_report").report)


def test_train_ab_and_cold_models_parse_what_the_suite_passes():
    ab = importlib.import_module("bench.train_ab")
    args = ab.parse_args(["--out", "o", "--limits", "64MiB,wd:32MiB,wd:auto", "--rounds", "9"])
    assert args.rounds == 9 and not ab.parse_args(["--out", "o", "--no-control"]).control
    cold = importlib.import_module("bench.cold_models")
    args = cold.parse_args(["--out", "o", "--models", "alexnet", "--limits", "64MiB", "--no-full"])
    assert (args.models, args.limits, args.full) == ("alexnet", "64MiB", False)
    assert cold.parse_args(["--out", "o", "--limits=", "--torch-runs", "1"]).limits == ""


def test_train_ab_s_table_names_its_rounds_and_iterations():
    train_ab = importlib.import_module("bench.train_ab")
    meta = dict(gpu="GPU", torch="2.x", rounds=15, iters=10)
    text = train_ab.markdown(meta, [dict(net="n", batch=2, precision="amp", error="boom")])
    assert "median over 15 rotating rounds of 10 iterations" in text and "{" not in text


def test_pressure_runs_its_variants_in_turns_and_tables_the_median_of_its_rounds():
    pressure = importlib.import_module("bench.pressure")
    plan = pressure.runs(["free", "torch", "control", "ucudnn"], [64 * MiB, 512 * MiB], 2)
    assert plan == [("free", 0, 0),
                    ("torch", 64 * MiB, 0), ("control", 64 * MiB, 0), ("ucudnn", 64 * MiB, 0),
                    ("control", 64 * MiB, 1), ("ucudnn", 64 * MiB, 1), ("torch", 64 * MiB, 1),
                    ("torch", 512 * MiB, 0), ("ucudnn", 512 * MiB, 0), ("ucudnn", 512 * MiB, 1), ("torch", 512 * MiB, 1)]
    row = dict(model="m", limit_mib=64.0, first_s=1.0, gradient_rel=0.0, gradient_fp64_rel=2e-3, torch_fp64_rel=1e-3,
               torch_fp32_fp64_rel=0.5,
               iteration_ms=[100.0] * 40)
    rows = [dict(row, variant="torch", steady_ms=ms) for ms in (10.0, 30.0, 14.0)]
    rows += [dict(row, variant="ucudnn", steady_ms=ms, iteration_ms=[first] + [100.0] * 39)
             for ms, first in ((7.0, 4100.0), (8.0, 5100.0))] + [dict(row, variant="control", steady_ms=12.0)]
    rows.append(dict(model="m", limit_mib=64.0, variant="ucudnn", error="CUDA out of memory"))
    rows.append(dict(row, variant="imported", steady_ms=9.0))
    # swapped: ucudnn's classes for 2 iterations, then torch's and ucudnn's in turns (t u u t), each t
    # paired with the u as far from a change of classes: 10/8 four times, 1.25; and 1.0 in another process
    rows += [dict(row, variant="swapped", steady_ms=0.0, arms="uutuuttuut",
                  iteration_ms=[50, 50, 10, 8, 8, 10, 10, 8, 8, 10]),
             dict(row, variant="swapped", steady_ms=0.0, arms="tuut", iteration_ms=[5, 5, 5, 5])]
    rows.append(dict(row, variant="swapped_control", steady_ms=0.0, arms="uutTTt", iteration_ms=[50, 50, 9, 10, 10, 9]))
    line = pressure.table(rows).splitlines()[-1]
    assert "| 14.0 (10.0-30.0, 3 runs) | 12.0 | 7.5 (7.0-8.0, 2 runs); 1 failed: CUDA out of memory |" in line
    assert "| 1.87x; with the A/A's 1.73x, p 0.40 |" in line and "| 2.0e-03, 1.0e-03 (torch in fp32: 5.0e-01) |" in line
    assert "| 2.0, 6.5 |" in line  # the first 20 iterations' seconds: torch's, ucudnn's (the median of 6.0 and 7.0)
    # imported; swapped: the median of 1.25 and 1.0; its A/A: 9/10 and 9/10
    assert line.endswith("| 9.0 | 1.125x (1.000-1.250, 2 runs); A/A 0.900x | 0/3, 1/3 |")  # out of memory: torch, ucudnn


def test_pressure_s_need_is_the_zero_workspace_peak_plus_what_torch_s_own_process_holds_outside_its_pool(tmp_path):
    pressure = importlib.import_module("bench.pressure")
    made = []

    def child(args, variant, *rest, **kw):
        made.append(variant)
        return dict(peak=1000 * MiB) if variant == "need" else dict(torch_outside=300 * MiB, steady_ms=1.0)
    args = argparse.Namespace(need_of={}, cache=str(tmp_path / "c.db"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pressure, "child", child)
        rows: list = []
        need = pressure.measured_need(args, "m", rows)
    assert made == ["need", "free"] and need["need"] == 1300 * MiB and [r["model"] for r in rows] == ["m", "m"]
    args.need_of = {"m": 5}
    assert pressure.measured_need(args, "m", [])["need"] == 5


def test_swapped_runs_ucudnn_s_classes_for_half_the_steps_then_both_in_abba_turns():
    pressure = importlib.import_module("bench.pressure")
    assert "".join(pressure.arm("swapped", i, 12) for i in range(12)) == "uuuuuu" + "tuuttu"
    assert "".join(pressure.arm("imported", i, 4) for i in range(4)) == "tttt"
    assert "".join(pressure.arm("swapped_control", i, 8) for i in range(8)) == "uuuu" + "tTTt"


# --- bench.common ------------------------------------------------------------------------------------

def test_chance_is_how_often_random_deals_lie_as_far_apart():
    assert common.chance([30.0, 31.0, 29.0, 30.5], [30.0, 31.0, 29.0, 30.5]) == 1.0  # one kind of process
    # three against three, all apart: 4 of the 20 deals have medians 9 or more apart (1,2,10 | 3,11,12 ...)
    assert common.chance([1.0, 2.0, 3.0], [10.0, 11.0, 12.0]) == pytest.approx(4 / 20, abs=0.01)


class Mark:
    """A CUDA event's stand-in: recorded at a fake clock's time."""

    clock = 0.0

    def __init__(self):
        self.at = Mark.clock

    def elapsed_time(self, other):
        return other.at - self.at


def test_variants_take_turns_who_goes_first_rotating():
    calls = []

    def time_loop(loop):
        loop()
        return 10.0  # ms for the whole loop
    times = common.alternate_rounds({"torch": lambda: calls.append("t"), "ucudnn": lambda: calls.append("u"),
                                     "control": lambda: calls.append("c")}, time_loop, rounds=4, steps=2)
    assert times == {"torch": [5.0] * 4, "ucudnn": [5.0] * 4, "control": [5.0] * 4}
    assert "".join(calls) == "ttuucc" + "uucctt" + "ccttuu" + "ttuucc"


def test_interleave_times_every_iteration_and_its_watch_sees_every_round():
    calls, seen = [], []

    def step(name, ms):
        def run():
            calls.append(name)
            Mark.clock += ms
        return run
    watch = types.SimpleNamespace(begin=lambda name: seen.append(f"begin {name}"), end=seen.append)
    marks = common.interleave({"torch": step("t", 2.0), "ucudnn": step("u", 3.0), "control": step("c", 1.0)},
                              rounds=4, iters=2, mark=Mark, watch=watch)
    assert "".join(calls) == "ttuucc" + "uucctt" + "ccttuu" + "ttuucc"
    assert common.iteration_ms(marks) == {"torch": [[2.0, 2.0]] * 4, "ucudnn": [[3.0, 3.0]] * 4,
                                          "control": [[1.0, 1.0]] * 4}
    assert seen[:4] == ["begin torch", "torch", "begin ucudnn", "ucudnn"] and len(seen) == 2 * 12


def test_the_blocker_leaves_the_runs_own_peak_plus_the_headroom():
    assert common.blocker_bytes(10240 * MiB, 1024 * MiB, 3072 * MiB, 64 * MiB) == (10240 - 2048 - 64) * MiB
    # a footprint below what is held already needs nothing more
    assert common.blocker_bytes(10240 * MiB, 3072 * MiB, 1024 * MiB, 64 * MiB) == (10240 - 64) * MiB
    assert common.blocker_bytes(2112 * MiB, 0, 2048 * MiB, 64 * MiB) == 0
    with pytest.raises(ValueError, match=r"^the GPU cannot hold the run plus the headroom: 1000 MiB free, the run "
                                         r"needs 2000 MiB more \(footprint 3000 MiB, 1000 MiB held\), headroom 64 MiB$"):
        common.blocker_bytes(1000 * MiB, 1000 * MiB, 3000 * MiB, 64 * MiB)


def test_a_childs_environment():
    env = common.child_env({"PYTHONPATH": "/site"})
    assert env["PYTHONPATH"] == f"{common.ROOT}:/site" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert common.child_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native"


def test_relative_error_is_a_norm_ratio_and_inf_where_not_finite():
    torch = pytest.importorskip("torch")
    want = torch.tensor([3.0, 4.0])
    assert common.relative_error(torch.tensor([3.0, 4.5]), want) == pytest.approx(0.1)
    assert common.relative_error(torch.tensor([float("nan"), 4.0]), want) == float("inf")


def test_each_tests_seconds_are_kept_as_it_ends_where_asked(tmp_path, monkeypatch):
    """conftest's hook: a GPU run cut by its time limit still says where its time went."""
    import conftest

    report = types.SimpleNamespace(duration=1.234, when="call", outcome="passed", nodeid="tests/t.py::test_a")
    monkeypatch.delenv("UCUDNN_TEST_TIMES", raising=False)
    conftest.pytest_runtest_logreport(report)  # not asked: writes nothing
    times = tmp_path / "times.tsv"
    monkeypatch.setenv("UCUDNN_TEST_TIMES", str(times))
    conftest.pytest_runtest_logreport(report)
    conftest.pytest_runtest_logreport(types.SimpleNamespace(**{**vars(report), "nodeid": "tests/t.py::test_b"}))
    assert times.read_text().splitlines() == ["1.23\tcall\tpassed\ttests/t.py::test_a", "1.23\tcall\tpassed\ttests/t.py::test_b"]


def test_pressure_s_gradient_check_turns_dropout_off_and_scales_the_loss_down_until_finite():
    """The gradient check draws no dropout masks (fp16 and float64 draw different ones from one
    seed) and, under AMP, scales the loss as a gradient scaler would: down by eighths from 1024
    from 2**16 where the gradients overflow (fpn_resnet50's did at 1024)."""
    torch = pytest.importorskip("torch")
    pressure = importlib.import_module("bench.pressure")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False), torch.nn.Dropout(0.5))
    with torch.no_grad():
        model[0].weight.fill_(1e34)  # its gradient 2 * 1e34 * 2**16 overflows float32, * 2**13 not
    x, released = torch.ones(1, 1), []
    args = types.SimpleNamespace(model="tiny")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pressure, "gradients", _float32_gradients(pressure.gradients))
        got = pressure.gradient_check(model, x, args, True, lambda: released.append(True))
    assert got["gradient_scale"] == 2.0**13 and released == [True]
    assert not model[1].training
    assert got["gradient_rel"] == 0.0 and got["gradient_fp64_rel"] < 1e-6, got
    assert got["torch_fp32_fp64_rel"] < 1e-6 and model[0].weight.dtype == torch.float32  # AMP's: float32 too


def _float32_gradients(gradients):
    """pressure.gradients on the CPU, with `amp` meaning a float32 step (no autocast there)."""
    def on_cpu(model, x, name, amp, scale=1.0):
        return gradients(model, x, name, False, scale)
    return on_cpu


def test_side_by_side_finds_the_cpus_near_each_gpu_and_nothing_where_it_cannot(tmp_path):
    """bench/side_by_side.sh pins each job to its GPU's NUMA node: the CPUs sysfs lists for the
    GPU's PCI device (nvidia-smi names it in upper case, its domain of eight digits or four); where
    nvidia-smi or the device is missing, no CPUs, and the job runs unpinned."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$4" in 1) echo 00000000:9A:00.0 ;; 2) echo 0000:9A:00.0 ;; *) exit 6 ;; esac\n')
    smi.chmod(0o755)
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:9a:00.0"
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text("32-63\n")
    script = (BENCH / "side_by_side.sh").read_text()
    near = script[script.index("near() {"):script.index("\n}\n", script.index("near() {")) + 3]

    def cpus(gpu: int, path: str) -> str:
        env = {"PATH": f"{path}:/usr/bin:/bin", "SYSFS": str(tmp_path / "sys")}
        return subprocess.run(["bash", "-c", f"set -u\n{near}near {gpu}"], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    assert cpus(1, str(tmp_path / "bin")) == "32-63"
    assert cpus(2, str(tmp_path / "bin")) == "32-63"  # a four-digit domain, as some drivers print it
    assert cpus(0, str(tmp_path / "bin")) == ""  # nvidia-smi knows no such GPU
    assert cpus(1, str(tmp_path / "none")) == ""  # no nvidia-smi


def test_largest_batch_doubles_until_a_failure_then_bisects_to_a_sixteenth():
    largest = importlib.import_module("bench.largest_batch").largest
    tried = []

    def fits(limit):
        def try_batch(b):
            tried.append(b)
            return b <= limit
        return try_batch
    lo, hi = largest(fits(100), 8, 1000)
    assert tried[:5] == [8, 16, 32, 64, 128] and lo <= 100 < hi and hi - lo <= max(1, lo // 16)
    assert largest(fits(5), 8, 64)[0] == 5  # below the model's own batch: bisected from zero
    assert largest(fits(10**6), 8, 64) == (64, 65)  # every batch up to the cap fits
    assert largest(fits(0), 8, 64)[0] == 0
    assert largest(lambda b: None, 8, 64) == (0, 65)  # out of time before any probe


def test_largest_batch_tables_each_variant_s_largest_passing_probe():
    module = importlib.import_module("bench.largest_batch")
    rows = [dict(model="m", variant="torch", batch=8, budget_mib=100.0, samples_per_s=80.0),
            dict(model="m", variant="torch", batch=16, budget_mib=100.0, error="OutOfMemoryError"),
            dict(model="m", variant="ucudnn", batch=16, budget_mib=100.0, samples_per_s=120.0)]
    assert module.table(rows).splitlines()[-1] == "| m | 100 MiB | 8, 80 | 16, 120 | 2.00x |"


@pytest.mark.gpu  # its model libraries (torchvision, torchaudio, monai from .whl/) are the GPU machines'
@pytest.mark.parametrize("name", ["unet3d", "convtasnet", "wav2vec2", "r3d_18", "densenet121"])
def test_pressure_s_models_build_and_give_a_loss_with_their_convolutions_of_every_kind(name):
    """Each model of bench/pressure.py that this machine's libraries hold builds from its MODELS
    entry (keywords, input shape) and runs a forward and backward to a finite loss on the CPU, at
    one sample, with the convolutions its family brings (3-D and transposed for unet3d, 1-D and
    transposed for convtasnet)."""
    torch = pytest.importorskip("torch")
    pressure = importlib.import_module("bench.pressure")
    pytest.importorskip(pressure.MODELS[name][0].split(":")[0].split(".")[0])
    model, x, _ = pressure.build(name, torch.device("cpu"), batch=1)
    kinds = {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)}
    expected = {"unet3d": {"Conv3d", "ConvTranspose3d"}, "convtasnet": {"Conv1d", "ConvTranspose1d"}}
    assert expected.get(name, set()) <= kinds, kinds
    if name == "unet3d":
        x = x[..., :32, :32, :32]  # the same layers on a smaller patch: the CPU's time
    loss = pressure.loss_of(pressure.forward(model, x, name))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_pressure_s_processes_say_where_they_came_on_their_machine(tmp_path):
    """A first iteration can pay for the caches a machine's first GPU process fills: each row
    says how many of the script's processes ran on the machine before it."""
    pressure = importlib.import_module("bench.pressure")
    log = str(tmp_path / "processes")
    assert [pressure.machine_order(log) for _ in range(3)] == [0, 1, 2]
