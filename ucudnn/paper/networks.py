"""The paper's figures of whole networks under WR (ucudnn.paper): AlexNet (Fig. 10), AlexNet,
ResNet-50 and DenseNet-40 (Fig. 11) at 8, 64 and 512 MiB per kernel under each batch size policy,
and the per-layer memory of AlexNet and ResNet-18 (Fig. 12)."""
from __future__ import annotations

import itertools
import math

from ..core.nets import Network, get_network
from ..core.problem import ConvKind
from ..plan.config import format_size
from ..reports.plots import plot_stacked
from ..reports.report import Report
from .evidence import CANDIDATES, DRAWN, Evidence
from .page import NOT_RECORDED, SHORT, Figure, Headline, Result, Table, against, ratio

MIB = 2**20
LIMITS = (8 * MIB, 64 * MIB, 512 * MIB)
POLICIES = ("undivided", "powerOfTwo", "all")
HEADLINE_LIMIT = 64 * MIB

Sweep = dict[tuple[str, int, str], "Report | None"]  # (candidates, limit, policy): the WR plan


def _sweep(evidence: Evidence, network: Network, batch: int, missing: list[str]) -> Sweep:
    """The WR plan of `network` at every limit, policy and candidate set (None: not recorded)."""
    return {(c, limit, policy): evidence.recorded(network, batch, evidence.settings(c, policy, limit), missing)
            for c in CANDIDATES for limit in LIMITS for policy in POLICIES}


def _speedup(evidence: Evidence, sweep: Sweep, c: str, limit: int, policy: str) -> float:
    """`policy`'s plan over undivided at the same limit; nan where it is not recorded."""
    report = sweep[c, limit, policy]
    return math.nan if report is None else evidence.total_ms(report, "undivided") / evidence.total_ms(report)


def _shown(value: float) -> str:
    return NOT_RECORDED if math.isnan(value) else ratio(value)


def _recorded_speedup(evidence: Evidence, sweep: Sweep, c: str) -> str:
    """The speedup at 64 MiB of `all`, or of powerOfTwo (named) where `all` is not recorded."""
    speedup = _speedup(evidence, sweep, c, HEADLINE_LIMIT, "all")
    if math.isnan(speedup):
        return f"{_shown(_speedup(evidence, sweep, c, HEADLINE_LIMIT, 'powerOfTwo'))} (powerOfTwo)"
    return ratio(speedup)


def _rows(evidence: Evidence, network: Network, sweep: Sweep) -> list[tuple]:
    rows = []
    for (c, limit, policy), report in sweep.items():
        measured = ((f"{evidence.total_ms(report):.2f}", ratio(_speedup(evidence, sweep, c, limit, policy)),
                     format_size(report.workspace)) if report else (NOT_RECORDED,) * 3)
        rows.append((network.name, c, format_size(limit), policy, *measured))
    return rows


def _panel(evidence: Evidence, sweep: Sweep) -> dict[str, dict[str, float]]:
    """Per-layer times of the drawn candidates' plans, a bar per limit and policy recorded."""
    return {f"{SHORT[policy]}\n{format_size(limit)}": evidence.layer_ms(report)
            for (c, limit, policy), report in sweep.items() if c == DRAWN and report}


def _notes(evidence: Evidence, network: Network, sweep: Sweep, paper: float) -> list[str]:
    """What the ratio at 64 MiB comes from: how far undivided at the limit is from the unlimited best."""
    notes = []
    for c in CANDIDATES:
        report, every = sweep[c, HEADLINE_LIMIT, "undivided"], sweep[c, HEADLINE_LIMIT, "all"]
        if report is None:
            continue
        best = evidence.total_ms(report, "best")
        gain = _speedup(evidence, sweep, c, HEADLINE_LIMIT, "all")
        notes.append(f"{network.name}, {CANDIDATES[c]}: undivided within 64 MiB takes "
                     f"{ratio(evidence.total_ms(report) / best)} the time of the unlimited best, and `all` "
                     + (f"{ratio(evidence.total_ms(every) / best)} of it "
                        f"({ratio(gain)} over undivided, {against(gain, paper)})."
                        if every is not None and not math.isnan(gain) else "is not in the measurements."))
    return notes


SCOPE = ("Now counts the convolution kernels (F, BD, BF) only, where the paper timed whole training iterations "
         "in its framework (and gives convolution-only ratios for Caffe alone).")


def _sweeps(evidence: Evidence, batches: dict[str, int], missing: list[str]) -> dict[str, tuple[Network, int, Sweep]]:
    """Each network's sweep at its batch, by name."""
    return {name: (get_network(name), batch, _sweep(evidence, get_network(name), batch, missing))
            for name, batch in batches.items()}


def _wr_result(evidence: Evidence, sweeps, headlines: list[Headline], notes: list[str], title: str,
               missing: list[str]) -> Result:
    rows = [row for network, _, sweep in sweeps.values() for row in _rows(evidence, network, sweep)]
    panels = {f"{network.name}, B = {batch} ({CANDIDATES[DRAWN]})": _panel(evidence, sweep)
              for network, batch, sweep in sweeps.values()}
    table = Table("Every limit per kernel and batch size policy (WR); workspace: each distinct kernel's once",
                  ("network", "candidates", "limit", "policy", f"ms ({evidence.label})", "speedup over undivided",
                   "workspace"), tuple(rows))
    return Result([table], headlines, notes, lambda path: plot_stacked(panels, f"time (ms, {evidence.label})", path,
                                                                        title), missing)


def alexnet(evidence: Evidence) -> Result:
    missing: list[str] = []
    sweeps = _sweeps(evidence, {"alexnet": 256}, missing)
    network, _, sweep = sweeps["alexnet"]

    def at(limit: int) -> tuple[str, ...]:
        return tuple(_shown(_speedup(evidence, sweep, c, limit, "all")) for c in CANDIDATES)

    footprint = {c: (sweep[c, 512 * MIB, "undivided"], sweep[c, HEADLINE_LIMIT, "all"]) for c in CANDIDATES}
    headlines = [
        Headline("AlexNet's convolutions at 64 MiB, all over undivided", "1.63x (K80 2.10x, V100 1.63x)",
                 at(HEADLINE_LIMIT)),
        Headline("... at 8 MiB", "none", at(8 * MIB)),
        Headline("... at 512 MiB", "negligible", at(512 * MIB)),
        Headline("workspace: undivided at 512 MiB, all at 64 MiB", "2.87 GiB, 0.70 GiB",
                 tuple(NOT_RECORDED if undivided is None or every is None
                       else f"{format_size(undivided.workspace)}, {format_size(every.workspace)}"
                       for undivided, every in footprint.values())),
        Headline("time: all at 64 MiB over undivided at 512 MiB", "1.04x",
                 tuple(NOT_RECORDED if undivided is None or every is None
                       else ratio(evidence.total_ms(every) / evidence.total_ms(undivided))
                       for undivided, every in footprint.values())),
    ]
    notes = [SCOPE, *_notes(evidence, network, sweep, 1.63)]
    return _wr_result(evidence, sweeps, headlines, notes, "Fig. 10: AlexNet (u undivided, p powerOfTwo, a all)",
                      missing)


FIG11 = {"alexnet": 256, "resnet50": 64, "densenet40": 256}  # the paper's batches
FIG11_PAPER = {"alexnet": 1.24, "resnet50": 1.06}  # at 64 MiB, TensorFlow, whole iterations


def networks(evidence: Evidence) -> Result:
    missing: list[str] = []
    sweeps = _sweeps(evidence, FIG11, missing)
    headlines = [Headline(f"{network.name}'s convolutions at 64 MiB, all (else powerOfTwo) over undivided",
                          ratio(FIG11_PAPER[name]) if name in FIG11_PAPER else "not stated",
                          tuple(_recorded_speedup(evidence, sweep, c) for c in CANDIDATES))
                 for name, (network, _, sweep) in sweeps.items()]
    notes = [SCOPE, "The paper's Fig. 11 AlexNet is TensorFlow's benchmark model; this one is Caffe's, as in Fig. 10."]
    notes += [note for name, paper in FIG11_PAPER.items() for note in _notes(evidence, *sweeps[name][::2], paper)]
    return _wr_result(evidence, sweeps, headlines, notes,
                      "Fig. 11: AlexNet, ResNet-50, DenseNet-40 (u undivided, p powerOfTwo, a all)", missing)


FIG12 = {"alexnet": 256, "resnet18": 128}  # the paper's batches
CUDNN_LIMIT, UCUDNN_LIMIT = 512 * MIB, 64 * MIB  # Fig. 12's limits per kernel: cuDNN's and μ-cuDNN's
PARTS = ("activations", "weights", "workspace")
Memory = dict[str, dict[str, float]]  # bytes per layer, per part


def _layer_memory(network: Network, batch: int, report: Report,
                  workspace=lambda kernel, configuration: configuration.workspace) -> Memory:
    """Bytes per layer in one forward pass: its input and output, its weights, and the largest
    workspace of its kernels (F, BD, BF) in `report` by `workspace(kernel, configuration)` (None: unknown)."""
    found = {}
    for layer in network.layers:
        p = layer.problem(ConvKind.FORWARD, batch)
        spaces = [workspace(row.kernel, row.configuration) for row in report.rows if row.kernel.layer == layer.name]
        found[layer.name] = {"activations": (math.prod(p.x_shape) + math.prod(p.y_shape)) * p.itemsize,
                             "weights": math.prod(p.w_shape) * p.itemsize,
                             "workspace": math.nan if None in spaces else max(spaces)}
    return found


def _total(memory: dict[str, float]) -> float:
    return sum(memory[part] for part in PARTS)


def _cut(cudnn: Memory, ours: Memory) -> tuple[str, float]:
    """The layer whose memory ucudnn cuts most, and by how much."""
    cuts = {layer: _total(cudnn[layer]) / _total(ours[layer]) for layer in cudnn}
    layer = max(cuts, key=cuts.__getitem__)
    return layer, cuts[layer]


def _memory_table(name: str, batch: int, network: Network, memory: dict[str, Memory]) -> Table:
    cudnn, ours = memory["cuDNN"], memory["ucudnn"]
    rows = tuple((layer.name, layer.count, *(_size(cudnn[layer.name][part]) for part in PARTS[:2]),
                  *(_size(m[layer.name]["workspace"]) for m in memory.values()),
                  *(_size(_total(m[layer.name])) for m in (cudnn, ours)),
                  ratio(_total(cudnn[layer.name]) / _total(ours[layer.name]))) for layer in network.layers)
    return Table(f"{name}, B = {batch}: bytes per layer in one forward pass ({CANDIDATES[DRAWN]})",
                 ("layer", "n", "activations", "weights", "workspace: cuDNN at 512 MiB", "ucudnn at 64 MiB", "torch",
                  "in all: cuDNN", "ucudnn", "cuDNN / ucudnn"), rows)


def memory(evidence: Evidence) -> Result:
    plans, memory = {}, {}
    for (name, batch), c in itertools.product(FIG12.items(), CANDIDATES):
        network = get_network(name)
        plans[name, c] = tuple(evidence.report(network.problems(batch), evidence.settings(c, policy, limit))
                               for policy, limit in (("undivided", CUDNN_LIMIT), ("powerOfTwo", UCUDNN_LIMIT)))
        memory[name, c] = {who: _layer_memory(network, batch, report) for who, report in zip(("cuDNN", "ucudnn"),
                                                                                            plans[name, c])}
    tables, panels = [], {}
    for name, batch in FIG12.items():
        network, ours = get_network(name), plans[name, DRAWN][1]
        drawn = memory[name, DRAWN] | {"torch": _layer_memory(network, batch, ours,
                                                              lambda kernel, _: evidence.torch_workspace(kernel))}
        tables.append(_memory_table(name, batch, network, drawn))
        shown = [who for who in drawn if evidence.executed or who != "torch"]
        panels[f"{name}, B = {batch}"] = {f"{layer.name} {who}": {part: v / MIB for part, v in drawn[who][layer.name].items()}
                                          for layer in network.layers for who in shown}
    cuts = {key: _cut(m["cuDNN"], m["ucudnn"]) for key, m in memory.items()}
    slowdown = {key: evidence.total_ms(ours) / evidence.total_ms(cudnn) for key, (cudnn, ours) in plans.items()}
    papers = {"alexnet": 3.43, "resnet18": 2.73}  # the largest cuts the paper reports
    headlines = [Headline(f"{name}: the largest cut of one layer's memory, cuDNN at 512 MiB over ucudnn at 64 MiB",
                          ratio(paper), tuple(f"{ratio(cuts[name, c][1])} ({cuts[name, c][0]})" for c in CANDIDATES))
                 for name, paper in papers.items()]
    headlines += [Headline(f"{name}: time of ucudnn at 64 MiB over cuDNN at 512 MiB", "1.17x (network not stated)",
                           tuple(ratio(slowdown[name, c]) for c in CANDIDATES)) for name in papers]
    notes = [_memory_note(name, memory[name, DRAWN], paper) for name, paper in papers.items()]
    notes.append("Fully-connected layers, which the paper also draws, are left out: ucudnn plans convolutions.")
    notes.append("torch: torch's own convolution, cudnn.benchmark on, memory free." if evidence.executed else
                 "The workspace torch takes is not in a recording of cuDNN's candidates: `ucudnn paper 12 --execute` "
                 "measures it on a GPU (torch's own convolution, cudnn.benchmark on, memory free).")
    return Result(tables, headlines, notes, lambda path: plot_stacked(
        panels, "MiB", path, "Fig. 12: memory per layer in one forward pass"))


def _memory_note(name: str, memory: dict[str, Memory], paper: float) -> str:
    """Where the largest cut of a layer's memory stands, and what bounds it: the activations."""
    cudnn, ours = memory["cuDNN"], memory["ucudnn"]
    layer, cut = _cut(cudnn, ours)
    return (f"{name} ({CANDIDATES[DRAWN]}): the largest cut, {ratio(cut)} at {layer}, is {against(cut, paper)}; "
            f"its workspace falls from {_size(cudnn[layer]['workspace'])} to {_size(ours[layer]['workspace'])}, "
            f"and its activations, {_size(ours[layer]['activations'])}, are "
            f"{100 * ours[layer]['activations'] / _total(ours[layer]):.0f}% of what it holds with ucudnn.")


def _size(nbytes: float) -> str:
    return "needs the GPU" if math.isnan(nbytes) else format_size(int(nbytes))


FIGURES = (
    Figure("10", "AlexNet at 8, 64 and 512 MiB per kernel under each batch size policy",
           "Caffe's AlexNet at B = 256 on K80, P100-SXM2 and V100-SXM2 (B = 1024) with WR: at 64 MiB per kernel "
           "`all` is 1.63x faster than undivided in its convolutions on P100 (1.40x the whole iteration); at "
           "8 MiB nothing improves, at 512 MiB the difference is negligible; undivided at 512 MiB takes 2.87 GiB "
           "of workspace, `all` at 64 MiB 0.70 GiB and 4% more time.", alexnet),
    Figure("11", "AlexNet, ResNet-50 and DenseNet-40 at 8, 64 and 512 MiB per kernel",
           "TensorFlow on P100-SXM2: AlexNet and DenseNet-40 (k = 40, CIFAR) at B = 256, ResNet-50 at B = 64; at "
           "64 MiB per kernel ucudnn is 1.24x faster on AlexNet and 1.06x on ResNet-50 (whole iterations).",
           networks),
    Figure("12", "memory per layer: activations, weights and workspace",
           "AlexNet (B = 256) and ResNet-18 (B = 128) on P100-SXM2, one forward pass per unique layer: with cuDNN "
           "at 512 MiB per kernel and μ-cuDNN at 64 MiB, a layer's memory is cut by up to 3.43x (AlexNet) and "
           "2.73x (ResNet-18), for a 1.17x slowdown.", memory),
)
