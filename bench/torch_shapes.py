"""Conv training steps through ucudnn.torch against torch's own, on random shapes of our own.

The bar: through ucudnn.torch, at a workspace limit that does not bind (4 GiB), no conv training
step runs slower than torch's. `--count` random nn.Conv2d layers are drawn from `--seed` (kernels
1/3/5/7, stride 1/2, dilation 1/2, dense, grouped, depthwise and pointwise, odd and even batches
1..96, spatial 7..112, bias or not; fp32 NCHW and fp16 channels_last under autocast; each x and y
at most 2**24 elements and each forward at most 4 GMAC, so no layer needs much memory or time).
For each, torch's layer (cudnn.benchmark) and a deep copy converted by
`ucudnn.torch.convert(copy, workspace_limit=LIMIT)` are warmed up (ucudnn plans on its first call
and captures graphs on its second), checked once (y, dx, dW and db of the two within the dtype's
bound), then timed: CUDA events around `--steps` training steps back to back (forward, backward
with a fixed dy, the input needing a gradient so BD runs; gradients set to None), torch, ucudnn
and the control alternating in `--rounds` rounds (who goes first rotates too), medians over
rounds. The control is an A/A test: a second deep copy of torch's layer, left unconverted, timed
as the other two are; torch/control is what the harness reports between identical work.

Verdict per shape: PASS when ucudnn's ms/step <= torch's x (1 + MARGIN), MARGIN = 3%: the two
are medians of rotating rounds on one GPU, whose differences between identical work (clocks,
L2 and allocator state, launch jitter) are a few percent at most on short steps; the report gives
the spread of torch's own rounds per shape and the A/A control's verdicts, so the margin can be
checked against the noise of the run itself. Results go to OUT/torch_shapes.json and
OUT/torch_shapes.md after every shape, so a run cut by --deadline (or killed) keeps what it
measured.

    PYTHONPATH=. python3 bench/torch_shapes.py --out OUT [--count 24] [--seed 0] [--limit 4GiB]
        [--steps 50] [--rounds 5] [--warmup 3] [--deadline 170] [--backend all|engines|legacy]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

MARGIN = 0.03
# ||a - b|| / ||b|| of one rounding, as tests/test_gpu_torch.py bounds each against float64: TF32
# (torch's default for cuDNN in fp32, which ucudnn follows) and fp16 with float32 accumulation.
# Two results each within it of the exact one are within twice it of each other.
ROUNDING_BOUNDS = {"fp32": 5e-3, "amp": 1e-2}
KINDS = ("F", "BD", "BF")
FAMILIES = ("dense", "grouped", "depthwise", "dilated", "strided", "pointwise")
PRECISIONS = ("fp32", "amp")
KERNEL_SIZES = (1, 3, 5, 7)
CHANNELS = (3, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
GROUP_WIDTHS = (4, 8, 16, 32)  # channels per group of grouped layers
MAX_BATCH = 96
SPATIAL = (7, 112)
MAX_ELEMENTS = 1 << 24  # per activation tensor (x or y): 64 MiB in fp32
MAX_MACS = 4 * 10**9  # per forward


# --- the shapes (pure) -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerSpec:
    """One random convolution layer and its input: square kernel, stride, padding and dilation."""

    index: int
    family: str
    precision: str
    batch: int
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    groups: int
    bias: bool
    height: int
    width: int

    def conv_kwargs(self) -> dict:
        """nn.Conv2d's keyword arguments."""
        return dict(in_channels=self.in_channels, out_channels=self.out_channels, kernel_size=self.kernel,
                    stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    bias=self.bias)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_channels, self.height, self.width)

    @property
    def output_hw(self) -> tuple[int, int]:
        return (output_size(self.height, self.kernel, self.stride, self.padding, self.dilation),
                output_size(self.width, self.kernel, self.stride, self.padding, self.dilation))

    def describe(self) -> str:
        """e.g. 'B=37 64->128 k3 s2 p1 d1 g1 56x56 bias'."""
        return (f"B={self.batch} {self.in_channels}->{self.out_channels} k{self.kernel} s{self.stride} "
                f"p{self.padding} d{self.dilation} g{self.groups} {self.height}x{self.width}"
                f"{' bias' if self.bias else ''}")


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """One spatial dimension of a convolution's output (torch's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def smallest_input(kernel: int, padding: int, dilation: int) -> int:
    """The smallest spatial size whose padded input covers the dilated kernel (one output)."""
    return max(dilation * (kernel - 1) + 1 - 2 * padding, 1)


def per_sample(spec: LayerSpec) -> tuple[int, int]:
    """(elements of the larger of x and y, multiply-adds of the forward) per sample."""
    out_h, out_w = spec.output_hw
    elements = max(spec.in_channels * spec.height * spec.width, spec.out_channels * out_h * out_w)
    macs = spec.out_channels * out_h * out_w * (spec.in_channels // spec.groups) * spec.kernel ** 2
    return elements, macs


def fitting_batch(spec: LayerSpec) -> int:
    """The largest batch <= spec.batch within MAX_ELEMENTS and MAX_MACS, of spec.batch's parity
    where it can be (0 when even one sample is too large)."""
    elements, macs = per_sample(spec)
    batch = min(spec.batch, MAX_ELEMENTS // elements, MAX_MACS // macs)
    if batch > 1 and batch % 2 != spec.batch % 2:
        batch -= 1
    return batch


def draw_channels(rng: random.Random, family: str) -> tuple[int, int, int]:
    """(in_channels, out_channels, groups) of a layer of `family`."""
    if family == "grouped":
        groups = rng.choice((2, 4, 8))
        return groups * rng.choice(GROUP_WIDTHS), groups * rng.choice(GROUP_WIDTHS), groups
    if family == "depthwise":
        channels = rng.choice([c for c in CHANNELS if c >= 8])
        return channels, channels * rng.choice((1, 2)), channels
    return rng.choice(CHANNELS), rng.choice(CHANNELS[1:]), 1


def draw_geometry(rng: random.Random, family: str) -> tuple[int, int, int, int]:
    """(kernel, stride, dilation, padding) of a layer of `family`."""
    kernel = 1 if family == "pointwise" else rng.choice(KERNEL_SIZES[1:] if family in ("depthwise", "dilated")
                                                        else KERNEL_SIZES)
    stride = 2 if family == "strided" else rng.choice((1, 1, 2))
    dilation = 2 if family == "dilated" else (rng.choice((1, 1, 1, 2)) if kernel > 1 else 1)
    padding = rng.choice((0, dilation * (kernel - 1) // 2, rng.randint(0, kernel - 1)))
    return kernel, stride, dilation, padding


def draw_layer(rng: random.Random, index: int) -> LayerSpec:
    """Layer `index`: its family and precision cycle (every family in both precisions within 12
    layers), odd batches at indices 1 and 2 mod 4; everything else is drawn from `rng`."""
    family = FAMILIES[index // 2 % len(FAMILIES)]
    in_channels, out_channels, groups = draw_channels(rng, family)
    kernel, stride, dilation, padding = draw_geometry(rng, family)
    odd = index % 4 in (1, 2)
    batch = 2 * rng.randint(0, MAX_BATCH // 2 - 1) + 1 if odd else 2 * rng.randint(1, MAX_BATCH // 2)
    smallest = smallest_input(kernel, padding, dilation)
    height = max(rng.randint(*SPATIAL), smallest)
    width = height if rng.random() < 0.5 else max(rng.randint(*SPATIAL), smallest)
    spec = LayerSpec(index, family, PRECISIONS[index % 2], batch, in_channels, out_channels, kernel, stride,
                     padding, dilation, groups, rng.random() < 0.5, height, width)
    return shrink(spec)


def shrink(spec: LayerSpec) -> LayerSpec:
    """`spec` with its batch cut to fit the memory and work caps, and its spatial size halved
    first where even one sample does not fit."""
    while fitting_batch(spec) < 1:
        smallest = smallest_input(spec.kernel, spec.padding, spec.dilation)
        smaller = replace_spec(spec, height=max(spec.height // 2, smallest), width=max(spec.width // 2, smallest))
        if smaller == spec:
            raise ValueError(f"{spec.describe()}: one sample exceeds the caps at its smallest input")
        spec = smaller
    return replace_spec(spec, batch=fitting_batch(spec))


def replace_spec(spec: LayerSpec, **changes) -> LayerSpec:
    return LayerSpec(**{**asdict(spec), **changes})


def random_layers(count: int, seed: int) -> list[LayerSpec]:
    """`count` layers, the same for the same seed."""
    rng = random.Random(seed)
    return [draw_layer(rng, index) for index in range(count)]


# --- timing, checking and verdicts (pure) -------------------------------------------------------------

def turns(names: list[str], rounds: int) -> Iterator[str]:
    """The names in `rounds` rounds, each name once a round, who goes first rotating."""
    for round_index in range(rounds):
        shift = round_index % len(names)
        yield from names[shift:] + names[:shift]


def alternate_rounds(variants: dict[str, Callable[[], None]], time_loop: Callable[[Callable[[], None]], float],
                     rounds: int, steps: int) -> dict[str, list[float]]:
    """Milliseconds per step of each variant in each round: `time_loop` times `steps` steps back
    to back; the variants take turns (see turns())."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in turns(list(variants), rounds):
        step = variants[name]

        def loop(step=step) -> None:
            for _ in range(steps):
                step()
        times[name].append(time_loop(loop) / steps)
    return times


def spread(times: list[float]) -> float:
    """(max - min) / median of a variant's rounds: the noise of the run itself."""
    return (max(times) - min(times)) / statistics.median(times)


def verdict(torch_ms: float, ucudnn_ms: float, margin: float = MARGIN) -> str:
    """PASS when ucudnn's step is no slower than torch's beyond the noise margin, else FAIL."""
    return "PASS" if ucudnn_ms <= torch_ms * (1 + margin) else "FAIL"


def error_limit(precision: str, output: str, bf_parts: int = 1) -> float:
    """Bound on ||ucudnn - torch|| / ||torch|| of one output: twice one rounding of the dtype, and
    for dW once more per BF micro-batch (each rounds its partial sum to the dtype)."""
    return 2 * ROUNDING_BOUNDS[precision] * (bf_parts if output == "dw" else 1)


def via(summary: dict) -> str:
    """Which kernels ran through ucudnn (with their micro-batch counts) and which through torch,
    from Context.summary(): e.g. 'ucudnn F(1) BD(1) BF(2)' or 'ucudnn F(1); torch BD BF'."""
    if summary.get("fallbacks"):
        return "torch (fallback: " + ", ".join(sorted(summary["fallbacks"])) + ")"
    order = {kind: i for i, kind in enumerate(KINDS)}
    kernels = sorted(summary.get("kernels", []), key=lambda k: order.get(k["kind"], len(KINDS)))
    ours = " ".join(f"{k['kind']}({k['parts']})" for k in kernels if k["via"] == "ucudnn")
    theirs = " ".join(k["kind"] for k in kernels if k["via"] != "ucudnn")
    return "; ".join(part for part in (ours and f"ucudnn {ours}", theirs and f"torch {theirs}") if part) or "-"


def bf_parts(summary: dict) -> int:
    return max([k.get("parts", 1) for k in summary.get("kernels", []) if k["kind"] == "BF"] or [1])


def result_row(spec: LayerSpec, times: dict[str, list[float]], errors: dict[str, float], summary: dict,
               first_step_s: float, margin: float = MARGIN) -> dict:
    """What is reported of one shape."""
    torch_ms, ucudnn_ms = statistics.median(times["torch"]), statistics.median(times["ucudnn"])
    control_ms = statistics.median(times["control"]) if times.get("control") else None
    limits = {name: error_limit(spec.precision, name, bf_parts(summary)) for name in errors}
    return dict(layer=asdict(spec), shape=spec.describe(), torch_ms=torch_ms, ucudnn_ms=ucudnn_ms,
                ratio=torch_ms / ucudnn_ms, verdict=verdict(torch_ms, ucudnn_ms, margin),
                control_ms=control_ms, control_ratio=None if control_ms is None else torch_ms / control_ms,
                control_verdict=None if control_ms is None else verdict(torch_ms, control_ms, margin),
                torch_spread=spread(times["torch"]), rounds=times, errors=errors, error_limits=limits,
                correct=all(errors[name] <= limits[name] for name in errors), via=via(summary),
                first_step_s=first_step_s, kernels=summary.get("kernels", []), runs=summary.get("runs", {}))


def worst_error(row: dict) -> str:
    """The output furthest from torch relative to its limit, e.g. 'dw 1.2e-03 (2.0e-02)'."""
    name = max(row["errors"], key=lambda n: row["errors"][n] / row["error_limits"][n])
    return f"{name} {row['errors'][name]:.1e} ({row['error_limits'][name]:.1e})"


def table_row(row: dict) -> str:
    layer = row["layer"]
    head = f"| {layer['index']} | {layer['family']} | {row['shape']} | {layer['precision']} |"
    if "error" in row:
        return f"{head} - | - | - | ERROR | - | - | {row['error'].splitlines()[0][:120]} |"
    correct = ("ok " if row["correct"] else "WRONG ") + worst_error(row)
    control = "-" if row.get("control_ratio") is None else f"{row['control_ratio']:.3f}"
    return (f"{head} {row['torch_ms']:.3f} | {row['ucudnn_ms']:.3f} | {row['ratio']:.3f} | {row['verdict']} | "
            f"{control} | {correct} | {row['via']} |")


TABLE_HEAD = ("| # | family | shape | precision | torch ms/step | ucudnn ms/step | torch/ucudnn | verdict | "
              "torch/copy (A/A) | max rel. error (limit) | via |\n|---|---|---|---|---|---|---|---|---|---|---|")


def findings(rows: list[dict], planned: int, margin: float = MARGIN) -> list[str]:
    """The bar in words: shapes measured, failed, wrong, and the noise of the run."""
    done = [r for r in rows if "error" not in r]
    failed = [r for r in done if r["verdict"] != "PASS"]
    wrong = [r for r in done if not r["correct"]]
    errors = [r for r in rows if "error" in r]
    passed = bool(done) and not (failed or wrong or errors)
    notes = [f"Bar (no step slower than torch's beyond {margin:.0%}, results within bounds): "
             f"{'PASS' if passed else 'FAIL'} on {len(done)} of {planned} shapes measured ({len(failed)} slower, "
             f"{len(wrong)} wrong, {len(errors)} errors, {planned - len(rows)} not reached before the deadline)"]
    if done:
        worst = min(done, key=lambda r: r["ratio"])
        notes.append(f"worst: #{worst['layer']['index']} {worst['shape']} {worst['layer']['precision']}, "
                     f"torch/ucudnn {worst['ratio']:.3f}")
        spreads = [r["torch_spread"] for r in done]
        notes.append(f"noise: torch's own rounds spread (max-min)/median {statistics.median(spreads):.1%} "
                     f"in the median shape, {max(spreads):.1%} at most")
        controlled = [r for r in done if r.get("control_ratio") is not None]
        if controlled:
            ratios = sorted(r["control_ratio"] for r in controlled)
            notes.append(f"A/A control (torch vs an unconverted copy of its layer, same harness): "
                         f"{sum(r['control_verdict'] != 'PASS' for r in controlled)} of {len(controlled)} shapes "
                         f"'slower' beyond the margin; torch/copy {ratios[0]:.3f} to {ratios[-1]:.3f}, median "
                         f"{statistics.median(ratios):.3f}")
    notes.append(f"correctness: {len(done) - len(wrong)} of {len(done)} shapes within bounds"
                 + (": WRONG " + ", ".join(f"#{r['layer']['index']}" for r in wrong) if wrong else ""))
    return notes


def markdown(meta: dict, rows: list[dict]) -> str:
    head = (f"# Conv training steps: torch vs ucudnn.torch at {meta['limit']} per kernel\n\n"
            f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, cuDNN {meta.get('cudnn', '?')}, "
            f"ucudnn backend {meta.get('backend') or 'default'}; {meta['steps']} steps back to back per "
            f"round, median of {meta['rounds']} rotating rounds; seed {meta['seed']}\n\n")
    notes = "\n".join(f"- {note}" for note in findings(rows, meta["count"], meta["margin"]))
    return head + TABLE_HEAD + "\n" + "\n".join(table_row(r) for r in rows) + "\n\n" + notes + "\n"


def out_of_time(left_s: float, layer_seconds: list[float], floor_s: float = 10.0) -> bool:
    """Whether another shape would likely overrun: less left than 1.5 x the slowest so far (or
    `floor_s` before the first)."""
    return left_s < max([floor_s] + [1.5 * s for s in layer_seconds])


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    notes = findings(rows, meta["count"], meta["margin"])
    (out / "torch_shapes.json").write_text(json.dumps(dict(meta=meta, findings=notes, rows=rows), indent=1))
    (out / "torch_shapes.md").write_text(markdown(meta, rows))


# --- measuring one shape (torch; runs on CPU with a NumPy backend in the tests) --------------------

def relative_errors(got: dict, want: dict) -> dict[str, float]:
    """||got - want|| / ||want|| per output, in float64 (inf where got is not finite)."""
    import torch

    errors = {}
    for name, reference in want.items():
        ours, theirs = got[name].double(), reference.double()
        finite = bool(torch.isfinite(ours).all())
        errors[name] = float((ours - theirs).norm() / theirs.norm().clamp_min(1e-30)) if finite else float("inf")
    return errors


def measure_layer(spec: LayerSpec, convert_copy: Callable, time_loop: Callable[[Callable[[], None]], float],
                  synchronize: Callable[[], None], device: str, args) -> dict:
    """One shape: warm both layers, check ucudnn's outputs against torch's once, time the steps."""
    from conv_step import Case

    case = Case(spec.conv_kwargs(), spec.input_shape, spec.precision == "amp", device, seed=spec.index)
    theirs = case.module
    ours, control = convert_copy(theirs), copy.deepcopy(theirs)
    began = time.perf_counter()
    case.step(ours)  # ucudnn plans (benchmarks) every kernel here
    synchronize()
    first_step_s = time.perf_counter() - began
    for module in (ours, theirs, control):
        for _ in range(args.warmup):
            case.step(module)
    errors = relative_errors(case.outputs(ours), case.outputs(theirs))
    times = alternate_rounds({"torch": lambda: case.step(theirs), "ucudnn": lambda: case.step(ours),
                              "control": lambda: case.step(control)}, time_loop, args.rounds, args.steps)
    return result_row(spec, times, errors, ours.ucudnn_context.summary(), first_step_s, args.margin)


def measure_all(layers: list[LayerSpec], measure: Callable[[LayerSpec], dict], meta: dict, out: Path,
                deadline_s: float, tidy: Callable[[], None] = lambda: None) -> list[dict]:
    """Every layer until the deadline, the report rewritten after each; an error is a row."""
    started, rows, seconds = time.perf_counter(), [], []
    for spec in layers:
        left = deadline_s - (time.perf_counter() - started)
        if out_of_time(left, seconds):
            print(f"deadline: {len(layers) - len(rows)} shapes not measured ({left:.0f} s left)", flush=True)
            break
        print(f"[{spec.index + 1}/{len(layers)}] {spec.family} {spec.describe()} {spec.precision} "
              f"({left:.0f} s left)", flush=True)
        began = time.perf_counter()
        try:
            rows.append(measure(spec))
        except Exception as exc:
            rows.append(dict(layer=asdict(spec), shape=spec.describe(), error=f"{type(exc).__name__}: {exc}",
                             trace=traceback.format_exc(limit=4)))
        tidy()
        seconds.append(time.perf_counter() - began)
        print("    " + table_row(rows[-1]), flush=True)
        meta["elapsed_s"] = time.perf_counter() - started
        write(out, meta, rows)
    meta["elapsed_s"] = time.perf_counter() - started
    write(out, meta, rows)
    return rows


# --- the GPU run -------------------------------------------------------------------------------------

def gpu_rig(args) -> tuple[Callable, Callable, Callable, Callable]:
    """(convert_copy, time_loop, synchronize, tidy) on the current CUDA device."""
    import torch

    import ucudnn.torch as ut
    from ucudnn.execute import gpu

    def convert_copy(module):
        return ut.convert(copy.deepcopy(module), workspace_limit=args.limit, cache_path=args.cache,
                          planning="first_call")  # steady state: planned on the first (warm-up) call

    def time_loop(loop: Callable[[], None]) -> float:
        return gpu.time_calls(loop, 1, torch.cuda.current_stream().cuda_stream)[0]

    def tidy() -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        gpu.free_pool()  # ucudnn's benchmarking scratch (CuPy's pool)

    return convert_copy, time_loop, torch.cuda.synchronize, tidy


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=24, help="random layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", default="4GiB", help="ucudnn's workspace limit per kernel (one that does not bind)")
    parser.add_argument("--steps", type=int, default=50, help="training steps back to back per timed loop")
    parser.add_argument("--rounds", type=int, default=9, help="rotating rounds (medians over them)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each layer after ucudnn's first")
    parser.add_argument("--margin", type=float, default=MARGIN, help="noise margin of the verdict")
    parser.add_argument("--deadline", type=float, default=170, help="seconds for the whole run")
    parser.add_argument("--backend", choices=("all", "engines", "legacy"), help="UCUDNN_BACKEND (default: its default)")
    parser.add_argument("--cache", help="ucudnn benchmark database (default OUT/ucudnn-bench.db)")
    args = parser.parse_args(argv)
    args.cache = args.cache or str(Path(args.out) / "ucudnn-bench.db")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.backend:
        os.environ["UCUDNN_BACKEND"] = args.backend  # read by the Settings each convert() makes
    import torch

    torch.backends.cudnn.version()  # torch's libcudnn first, so ucudnn binds the same library
    torch.backends.cudnn.benchmark = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                backend=os.environ.get("UCUDNN_BACKEND"), limit=args.limit, count=args.count, seed=args.seed,
                steps=args.steps, rounds=args.rounds, warmup=args.warmup, margin=args.margin,
                tf32=torch.backends.cudnn.allow_tf32, cache=args.cache)
    convert_copy, time_loop, synchronize, tidy = gpu_rig(args)
    measure = lambda spec: measure_layer(spec, convert_copy, time_loop, synchronize, "cuda", args)  # noqa: E731
    measure_all(random_layers(args.count, args.seed), measure, meta, out, args.deadline, tidy)
    print((out / "torch_shapes.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
