"""The paper's figures of workspace division (ucudnn.paper): WD against WR at equal totals on
AlexNet and ResNet-50 (Fig. 13), and how WD divides AlexNet's 120 MiB (Fig. 14)."""
from __future__ import annotations

from ..core.nets import Network, get_network
from ..optimizers import DIVIDING, OPTIMIZERS, PER_KERNEL
from ..plan.config import format_size
from ..reports.plots import plot_stacked
from ..reports.report import Report
from .evidence import CANDIDATES, DRAWN, Evidence
from .kernels import desirable_fronts
from .page import NOT_RECORDED, SHORT, Figure, Headline, Result, Table, against, ratio

MIB = 2**20
# network: (batch, limits per kernel L); WD gets L times the kernels, every occurrence counted as the
# paper counts them (AlexNet: 15 x 8 MiB = 120 MiB; ResNet-50: 159 x 16 MiB = 2,544 MiB)
FIG13 = {"alexnet": (256, (8 * MIB, 64 * MIB)), "resnet50": (32, (16 * MIB, 32 * MIB))}
WR, WD = PER_KERNEL.name, DIVIDING.name
VARIANTS = ((WR, "undivided"), (WR, "powerOfTwo"), (WR, "all"), (WD, "powerOfTwo"), (WD, "all"))
LARGEST = ("conv2", "conv3")  # the layers the paper's WD gives most of AlexNet's workspace

Plans = dict[tuple[str, int, str, str], "Report | None"]  # (candidates, L, optimizer, policy): the plan


def occurrences(network: Network) -> int:
    """The network's kernels, every occurrence counted: what the paper multiplies L by."""
    return 3 * network.conv_layers


def _total(network: Network, limit: int, optimizer: str) -> int:
    """The workspace a variant at L per kernel has: L per kernel (WR), or L times the kernels (WD)."""
    return limit * occurrences(network) if OPTIMIZERS[optimizer].divides else limit


def _plans(evidence: Evidence, network: Network, batch: int, limits, missing: list[str]) -> Plans:
    def settings(c: str, limit: int, optimizer: str, policy: str):
        if not OPTIMIZERS[optimizer].divides:
            return evidence.settings(c, policy, limit)
        return evidence.settings(c, policy, total=_total(network, limit, optimizer))
    return {(c, limit, *variant): evidence.recorded(network, batch, settings(c, limit, *variant), missing)
            for c in CANDIDATES for limit in limits for variant in VARIANTS}


def _wd(plans: Plans, c: str, limit: int) -> tuple[str, Report | None]:
    """WD's plan at L per kernel: of policy all where recorded, else powerOfTwo."""
    policy = "all" if plans[c, limit, WD, "all"] else "powerOfTwo"
    return policy, plans[c, limit, WD, policy]


def _cell(evidence: Evidence, report: Report | None) -> str:
    return NOT_RECORDED if report is None else f"{evidence.total_ms(report):.2f}"


def _over(evidence: Evidence, slower: Report | None, faster: Report | None) -> str:
    if slower is None or faster is None:
        return NOT_RECORDED
    return ratio(evidence.total_ms(slower) / evidence.total_ms(faster))


def _ilp(wd: tuple[str, Report | None]) -> str:
    policy, report = wd
    if report is None:
        return NOT_RECORDED
    s = report.solver
    assert s is not None  # WD's report
    return f"{s['variables']} variables, {1e3 * s['solve_seconds']:.2f} ms ({s['solver'].upper()}, {policy})"


def _split(evidence: Evidence, undivided: Report | None, wr: Report | None, wd: Report | None) -> str:
    """AlexNet's WD all over WR undivided at 120 MiB, as WR all's micro-batching times WD's division."""
    return (f"At 120 MiB ({CANDIDATES[DRAWN]}) WD all's {_over(evidence, undivided, wd)} over WR undivided is WR all's "
            f"{_over(evidence, undivided, wr)} over WR undivided (micro-batches within 8 MiB each) times WD all's "
            f"{_over(evidence, wr, wd)} over WR all (the 120 MiB divided where it pays).")


def equal_totals(evidence: Evidence) -> Result:
    missing: list[str] = []
    networks = {name: get_network(name) for name in FIG13}
    plans = {name: _plans(evidence, networks[name], batch, limits, missing) for name, (batch, limits) in FIG13.items()}
    rows = [(name, c, format_size(limit), format_size(_total(networks[name], limit, WD)),
             *(_cell(evidence, plans[name][(c, limit) + variant]) for variant in VARIANTS))
            for name, (_, limits) in FIG13.items() for c in CANDIDATES for limit in limits]
    panels = {f"{name}, B = {batch} ({CANDIDATES[DRAWN]})": {
        f"{optimizer.upper()} {SHORT[policy]}\n{format_size(_total(networks[name], limit, optimizer))}": evidence.layer_ms(report)
        for (c, limit, optimizer, policy), report in plans[name].items() if c == DRAWN and report}
        for name, (batch, _) in FIG13.items()}
    alexnet, resnet = plans["alexnet"], plans["resnet50"]
    (small, large), (half, whole) = FIG13["alexnet"][1], FIG13["resnet50"][1]
    headlines = [
        Headline("AlexNet, 120 MiB in total: WD all over WR undivided at 8 MiB per kernel", "1.38x",
                 tuple(_over(evidence, alexnet[c, small, WR, "undivided"], alexnet[c, small, WD, "all"])
                       for c in CANDIDATES)),
        Headline("AlexNet: WD all at 120 MiB over WR undivided at 64 MiB per kernel (960 MiB in total)",
                 "1.24x (the whole iteration)",
                 tuple(_over(evidence, alexnet[c, large, WR, "undivided"], alexnet[c, small, WD, "all"])
                       for c in CANDIDATES)),
        Headline("ResNet-50, B = 32: WD at 2,544 MiB over WR undivided at 32 MiB per kernel (5,088 MiB in total)",
                 "1.14x (1.05x the whole iteration)",
                 tuple(f"{_over(evidence, resnet[c, whole, 'wr', 'undivided'], report)} ({policy})"
                       for c in CANDIDATES for policy, report in [_wd(resnet, c, half)])),
        Headline("ResNet-50, B = 32, WD at 5,088 MiB: the ILP", "562 variables, 5.46 ms (GLPK)",
                 tuple(_ilp(_wd(resnet, c, whole)) for c in CANDIDATES)),
    ]
    resnet50, batch = networks["resnet50"], FIG13["resnet50"][0]
    distinct = len(resnet50.problems(batch))
    notes = [
        f"Totals count every kernel occurrence, as the paper does (ResNet-50: {occurrences(resnet50)} kernels); "
        f"ucudnn gives identical layers one plan and one workspace, so WR at {format_size(half)} per kernel allocates "
        f"at most {format_size(half * distinct)} there, and WD's ILP has a group of variables per distinct kernel "
        f"({distinct}).",
        _split(evidence, alexnet[DRAWN, small, WR, "undivided"], alexnet[DRAWN, small, WR, "all"],
               alexnet[DRAWN, small, WD, "all"]),
    ]
    table = Table(f"Total time of every variant (ms, {evidence.label}); WR at L per kernel, WD dividing the total",
                  ("network", "candidates", "L per kernel", "total", *(f"{o.upper()} {p}" for o, p in VARIANTS)),
                  tuple(rows))
    return Result([table], headlines, notes, lambda path: plot_stacked(
        panels, f"time (ms, {evidence.label})", path, "Fig. 13: WR against WD at equal totals (u undivided, p powerOfTwo, a all)"), missing)


DIVIDED = ("alexnet", 256, 8 * MIB)  # Fig. 14: WR's limit per kernel; WD's total, 120 MiB, is Fig. 8's limit


def _share(report: Report, layers: tuple[str, ...]) -> float:
    """The part of the report's workspace that the kernels of `layers` get."""
    return sum(row.configuration.workspace for row in report.rows if row.kernel.layer in layers) / report.workspace


def _largest(report: Report, layers: tuple[str, ...]) -> int:
    return max(row.configuration.workspace for row in report.rows if row.kernel.layer in layers)


def division(evidence: Evidence) -> Result:
    name, batch, limit = DIVIDED
    network = get_network(name)
    kernels, total = network.problems(batch), limit * occurrences(network)
    plans = {(c, policy): evidence.report(kernels, evidence.settings(c, policy, total=total))
             for c in CANDIDATES for policy in ("powerOfTwo", "all")}
    wr = {c: evidence.report(kernels, evidence.settings(c, "undivided", limit)) for c in CANDIDATES}
    fronts = {c: desirable_fronts(evidence, c, kernels) for c in CANDIDATES}
    conv5 = [k.name for k in kernels].index("conv5/F")
    fastest = {c: fronts[c][conv5][-1] for c in CANDIDATES}
    speedup = {c: evidence.time_ms(kernels[conv5], wr[c].rows[conv5].configuration)
               / evidence.time_ms(kernels[conv5], fastest[c]) for c in CANDIDATES}
    headlines = [
        Headline("WD all at 120 MiB: conv2's and conv3's share of the workspace", "93.7%",
                 tuple(percent(_share(plans[c, "all"], LARGEST)) for c in CANDIDATES)),
        Headline("... the largest segment of a conv4 or conv5 kernel", "under 3 MiB",
                 tuple(format_size(_largest(plans[c, "all"], ("conv4", "conv5"))) for c in CANDIDATES)),
        Headline("conv5/F's fastest desirable configuration within 120 MiB over WR undivided at 8 MiB",
                 "1.29x, 109 MiB (FFT on 2 micro-batches)",
                 tuple(f"{ratio(speedup[c])}, {format_size(fastest[c].workspace)} ({fastest[c].describe()})"
                       for c in CANDIDATES)),
    ]
    largest = _share(plans[DRAWN, "all"], LARGEST)
    notes = [
        f"WD all gives conv2 and conv3 {percent(largest)} of the 120 MiB ({CANDIDATES[DRAWN]}), "
        f"{against(largest, 0.937, percent)}; under WR undivided at 8 MiB they take "
        f"{percent(_time_share(evidence, wr[DRAWN], LARGEST))} of the time here.",
        "The WD powerOfTwo division is the plan [docs/img/alexnet-wd-120MiB.png](../img/alexnet-wd-120MiB.png) "
        "draws (`ucudnn optimize --net alexnet --batch 256 --optimizer wd --total-workspace 120MiB --plot ...`).",
    ]
    rows = tuple((k.name, format_size(wr[DRAWN].rows[i].configuration.workspace),
                  *_segment(plans[DRAWN, "powerOfTwo"], i), *_segment(plans[DRAWN, "all"], i))
                 for i, k in enumerate(kernels))
    table = Table(f"AlexNet, B = {batch}: each kernel's workspace ({CANDIDATES[DRAWN]})",
                  ("kernel", "WR undivided, 8 MiB each", "WD powerOfTwo, 120 MiB", "workspace", "share",
                   "WD all, 120 MiB", "workspace", "share"), rows)
    bars = {"WR undivided\n8 MiB each": wr[DRAWN]} | {f"WD {p}\n120 MiB": plans[DRAWN, p] for p in ("powerOfTwo", "all")}
    panels = {f"AlexNet, B = {batch} ({CANDIDATES[DRAWN]})": {
        label: {row.kernel.name: row.configuration.workspace / MIB for row in report.rows}
        for label, report in bars.items()}}
    return Result([table], headlines, notes, lambda path: plot_stacked(
        panels, "workspace (MiB)", path, "Fig. 14: the workspace each kernel gets"))


def _segment(report: Report, i: int) -> tuple[str, str, str]:
    """Kernel i's configuration, workspace and share of the report's workspace."""
    configuration = report.rows[i].configuration
    return (configuration.describe(), format_size(configuration.workspace),
            percent(configuration.workspace / report.workspace))


def _time_share(evidence: Evidence, report: Report, layers: tuple[str, ...]) -> float:
    times = evidence.layer_ms(report)
    return sum(times[layer] for layer in layers) / sum(times.values())


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


FIGURES = (
    Figure("13", "WR against WD at equal totals",
           "AlexNet (B = 256) and ResNet-50 (B = 32) on P100-SXM2 with Caffe: at 120 MiB in total WD with `all` is "
           "1.38x faster than WR undivided in AlexNet's convolutions (1.24x the iteration), and beats WR "
           "undivided at 960 MiB by 1.24x; on ResNet-50 WD at 2,544 MiB is 1.14x faster (1.05x the iteration) "
           "than WR undivided at 5,088 MiB; its ILP at 5,088 MiB has 562 variables, solved by GLPK in 5.46 ms.",
           equal_totals),
    Figure("14", "how WD divides AlexNet's 120 MiB",
           "AlexNet on P100-SXM2, WR at 8 MiB per kernel against WD at 120 MiB in total: WD gives conv2 and conv3 "
           "93.7% of the workspace and no conv4 or conv5 kernel over 3 MiB, although conv5's fastest desirable "
           "configuration (FFT on 2 micro-batches, 109 MiB) is 1.29x faster than the baseline.", division,
           executes=False),
)
