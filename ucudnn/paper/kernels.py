"""The paper's figures of single AlexNet kernels (ucudnn.paper): one byte less than the best
algorithm needs (Fig. 1), conv2's desirable configurations (Fig. 8) and conv2 under each batch
size policy (Fig. 9). Caffe's single-column AlexNet at B = 256, as the paper."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.nets import find_kernel, get_network
from ..core.problem import ConvKind, Kernel
from ..core.staging import slices_of
from ..execute.backends import backend_of
from ..optimizers.configuration import Configuration
from ..optimizers.pareto import desirable_sets
from ..optimizers.wr import optimize_wr
from ..plan.config import format_size
from ..reports.plots import plot_configurations, plot_front, plot_stacked
from .evidence import CANDIDATES, DRAWN, Evidence
from .page import Figure, Headline, Result, Table, against, ratio

MIB = 2**20
NETWORK, BATCH = "alexnet", 256
CONV2 = "conv2/F"
POLICIES = ("undivided", "powerOfTwo", "all")


def _alexnet(kinds=tuple(ConvKind)):
    return get_network(NETWORK).problems(BATCH, kinds=kinds)


def candidates_of(configurations) -> str:
    """'legacy:FFT, engines:eng1': the candidates `configurations` run, in order."""
    return ", ".join(dict.fromkeys(m.algo for c in configurations for m in c.micro))


@dataclass(frozen=True)
class Fallback:
    """A forward layer's fastest undivided configuration with no limit (`best`) and within one byte
    less than that needs (`less`), with their times and the candidates available at B (those on
    the time-workspace front: what a recording keeps, measurements.plannable)."""

    kernel: Kernel
    best: Configuration
    less: Configuration
    best_ms: float
    less_ms: float
    candidates: int

    @property
    def slowdown(self) -> float:
        return self.less_ms / self.best_ms


def _fallbacks(evidence: Evidence, candidates: str) -> list[Fallback]:
    kernels = _alexnet((ConvKind.FORWARD,))
    tables = evidence.measure(evidence.settings(candidates, "undivided"))([k.problem for k in kernels], None)
    found = []
    for k in kernels:
        table = tables[k.problem.key]
        best = optimize_wr(table, BATCH, (BATCH,), None, kernel=k.name)
        less = optimize_wr(table, BATCH, (BATCH,), best.workspace - 1, kernel=k.name) if best.workspace else best
        found.append(Fallback(k, best, less, evidence.time_ms(k, best), evidence.time_ms(k, less),
                              len(table.choices(BATCH))))
    return found


def one_byte_less(evidence: Evidence) -> Result:
    found = {c: _fallbacks(evidence, c) for c in CANDIDATES}
    conv2 = {c: next(f for f in found[c] if f.kernel.layer == "conv2") for c in CANDIDATES}
    worst = {c: max(found[c], key=lambda f: f.slowdown) for c in CANDIDATES}
    rows = tuple((f.kernel.layer, c, f.best.describe(), format_size(f.best.workspace), f"{f.best_ms:.3f}",
                  f.less.describe(), format_size(f.less.workspace), f"{f.less_ms:.3f}", ratio(f.slowdown))
                 for c in CANDIDATES for f in found[c])
    headlines = [
        Headline("conv2/F with one byte less than its best algorithm needs, over the best", "4.51x (cuDNN 7.0.1)",
                 tuple(ratio(conv2[c].slowdown) for c in CANDIDATES)),
        Headline("the largest such slowdown of a forward layer", "4.51x (conv2)",
                 tuple(f"{ratio(worst[c].slowdown)} ({worst[c].kernel.layer})" for c in CANDIDATES)),
        Headline("the forward pass, every layer one byte short, over the best", "not stated",
                 tuple(ratio(sum(f.less_ms for f in found[c]) / sum(f.best_ms for f in found[c])) for c in CANDIDATES)),
    ]
    counts = {c: sorted(f.candidates for f in found[c]) for c in CANDIDATES}
    legacy, every = worst["legacy"], worst["all"]
    notes = [
        f"On each size's time-workspace front (what the recording keeps) a forward layer has {counts['legacy'][0]} to "
        f"{counts['legacy'][-1]} legacy algorithms and {counts['all'][0]} to {counts['all'][-1]} candidates in all at "
        f"B = {BATCH}: one byte less than the best falls to the next point of it.",
        f"With the legacy algorithms alone one byte less costs up to {ratio(legacy.slowdown)}, "
        f"{against(legacy.slowdown, 4.51)} ({legacy.kernel.layer}: {legacy.best.describe()} falls back to "
        f"{legacy.less.describe()}); among all candidates at most {ratio(every.slowdown)} ({every.kernel.layer} "
        f"falls back to {every.less.describe()}, {format_size(every.less.workspace)}), the fallbacks there coming from "
        f"{' and '.join(sorted({backend_of(m.algo) for f in found['all'] for m in f.less.micro}))}.",
        f"conv2's best legacy algorithm, {conv2['legacy'].best.describe()} ({format_size(conv2['legacy'].best.workspace)}), "
        f"leaves {conv2['legacy'].less.describe()} ({format_size(conv2['legacy'].less.workspace)}) to one byte less: "
        f"{ratio(conv2['legacy'].slowdown)}.",
    ]
    panels = {"AlexNet forward, B = 256": {
        f"{which}\n{c}": {f.kernel.layer: getattr(f, f"{which.split()[-1]}_ms") for f in found[c]}
        for c in CANDIDATES for which in ("best", "one byte less")}}
    return Result([Table("Each forward layer: the best undivided algorithm with no limit, and with one byte less",
                         ("layer", "candidates", "best", "workspace", f"ms ({evidence.label})", "one byte less",
                          "workspace", f"ms ({evidence.label})", "slowdown"), rows)],
                  headlines, notes, lambda path: plot_stacked(panels, f"time (ms, {evidence.label})", path,
                                                              "Fig. 1: the best algorithm against one byte less"))


DESIRABLE_LIMIT = 120 * MIB  # Fig. 8's workspace limit


def desirable_fronts(evidence: Evidence, candidates: str, kernels) -> list[list[Configuration]]:
    """The desirable set of each kernel at policy all within DESIRABLE_LIMIT."""
    settings = evidence.settings(candidates, "all", DESIRABLE_LIMIT)
    tables = evidence.measure(settings)([k.problem for k in kernels], DESIRABLE_LIMIT)
    return desirable_sets([(tables[k.problem.key], BATCH, settings.sizes(BATCH)) for k in kernels],
                          DESIRABLE_LIMIT, [slices_of(k.problem) for k in kernels])


def desirable(evidence: Evidence) -> Result:
    kernels = _alexnet()
    fronts = {c: desirable_fronts(evidence, c, kernels) for c in CANDIDATES}
    conv2 = [k.name for k in kernels].index(CONV2)
    fastest = {c: fronts[c][conv2][-1] for c in CANDIDATES}
    largest = {c: max(range(len(kernels)), key=lambda i: len(fronts[c][i])) for c in CANDIDATES}
    headlines = [
        Headline("conv2/F's fastest desirable configuration within 120 MiB", "2 x 128 FFT_TILING",
                 tuple(f"{fastest[c].describe()}, {format_size(fastest[c].workspace)}" for c in CANDIDATES)),
        Headline("desirable configurations of conv2/F within 120 MiB", "not stated",
                 tuple(str(len(fronts[c][conv2])) for c in CANDIDATES)),
        Headline("the most desirable configurations of one AlexNet kernel", "68 (section IV-D)",
                 tuple(f"{len(fronts[c][largest[c]])} ({kernels[largest[c]].name})" for c in CANDIDATES)),
    ]
    notes = [
        f"The fastest point runs {candidates_of([fastest['legacy']])} with the legacy algorithms and "
        f"{candidates_of([fastest['all']])} among all candidates, where the paper's ran FFT_TILING on two halves.",
        f"conv2/F has {len(fronts['legacy'][conv2])} desirable configurations with the legacy algorithms and "
        f"{len(fronts['all'][conv2])} with all candidates; the largest set of a kernel, "
        f"{len(fronts['all'][largest['all']])}, is {against(len(fronts['all'][largest['all']]), 68, str)}.",
    ]
    settings = evidence.settings(DRAWN, "all", DESIRABLE_LIMIT)
    row = evidence.report([kernels[conv2]], settings).rows[0]  # its plan: the fastest point, starred
    front = fronts[DRAWN][conv2]
    rows = tuple((i + 1, format_size(c.workspace), f"{c.time_ms:.3f}", c.describe()) for i, c in enumerate(front))
    return Result([Table(f"conv2/F, B = {BATCH}, policy all, within 120 MiB: its desirable configurations "
                         f"({CANDIDATES[DRAWN]}), fastest last; ms is the sum of the measured micro-batches",
                         ("point", "workspace", "ms", "configuration"), rows)],
                  headlines, notes, lambda path: plot_front(row, front, DESIRABLE_LIMIT, path,
                                                            "Fig. 8: AlexNet conv2/F, B = 256, within 120 MiB"))


POLICY_LIMIT = 64 * MIB  # Fig. 9's workspace limit


def policies(evidence: Evidence) -> Result:
    kernel = find_kernel(_alexnet(), CONV2)
    reports = {(c, p): evidence.report([kernel], evidence.settings(c, p, POLICY_LIMIT)).rows[0]
               for c in CANDIDATES for p in POLICIES}
    plans = {key: row.configuration for key, row in reports.items()}
    ms = {key: evidence.time_ms(kernel, configuration) for key, configuration in plans.items()}
    speedup = {key: ms[key[0], "undivided"] / value for key, value in ms.items()}
    rows = tuple((c, p, plans[c, p].describe(), format_size(plans[c, p].workspace), f"{ms[c, p]:.3f}",
                  ratio(speedup[c, p])) for c in CANDIDATES for p in POLICIES)

    def plan(policy: str) -> tuple[str, ...]:
        return tuple(f"{plans[c, policy].describe()}, {format_size(plans[c, policy].workspace)}" for c in CANDIDATES)

    headlines = [
        Headline("undivided: cuDNN's choice within 64 MiB", "GEMM, 4.3 KiB", plan("undivided")),
        Headline("powerOfTwo's configuration", "FFT on micro-batches of 32, 48.9 MiB", plan("powerOfTwo")),
        Headline("all's configuration", "Winograd", plan("all")),
        Headline("all over undivided", "2.33x", tuple(ratio(speedup[c, "all"]) for c in CANDIDATES)),
        Headline("powerOfTwo over undivided", "not stated", tuple(ratio(speedup[c, "powerOfTwo"]) for c in CANDIDATES)),
    ]
    best = {c: reports[c, "undivided"].best for c in CANDIDATES}
    notes = [
        f"Undivided with no limit the fastest is {best['legacy'].describe()} ({format_size(best['legacy'].workspace)}) "
        f"among the legacy algorithms and {best['all'].describe()} ({format_size(best['all'].workspace)}) among all "
        f"candidates (the paper: FFT, 213 MiB): {_beyond(best.values(), POLICY_LIMIT)} on the whole batch. "
        "Undivided within 64 MiB takes " + " and ".join(
            f"{ratio(ms[c, 'undivided'] / evidence.time_ms(kernel, best[c]))} ({c})" for c in CANDIDATES)
        + " the time of that unlimited best: what dividing can win back.",
        f"Divided, `all` runs {candidates_of([plans['legacy', 'all']])} ({ratio(speedup['legacy', 'all'])}, "
        f"{against(speedup['legacy', 'all'], 2.33)}) with the legacy algorithms and "
        f"{candidates_of([plans['all', 'all']])} ({ratio(speedup['all', 'all'])}) among all candidates, where the "
        "paper's ran Winograd.",
    ]
    drawn = {f"{p}\n{format_size(plans[DRAWN, p].workspace)}": plans[DRAWN, p] for p in POLICIES}
    return Result([Table(f"conv2/F, B = {BATCH}, within 64 MiB, each batch size policy (WR)",
                         ("candidates", "policy", "configuration", "workspace", f"ms ({evidence.label})",
                          "speedup over undivided"), rows)],
                  headlines, notes, lambda path: plot_configurations(
                      drawn, path, f"Fig. 9: AlexNet conv2/F, B = 256, within 64 MiB ({CANDIDATES[DRAWN]})"))


def _beyond(configurations, limit: int) -> str:
    """'both beyond 64.0 MiB': where the workspaces of `configurations` stand to `limit`."""
    sides = {"beyond" if c.workspace > limit else "within" for c in configurations}
    return f"{'both ' if len(sides) == 1 else 'one '}{' and one '.join(sorted(sides))} {format_size(limit)}"


FIGURES = (
    Figure("1", "AlexNet's forward layers with the best algorithm and with one byte less",
           "forward convolutions of single-column AlexNet with cuDNN 7.0.1 (GPU not stated), each layer with its "
           "fastest algorithm and with the workspace limited to one byte less than that algorithm needs: conv2 "
           "runs 4.51x slower.", one_byte_less),
    Figure("8", "the desirable configurations of AlexNet's conv2 (forward)",
           "the Pareto front of conv2's forward convolution on P100-SXM2 within 120 MiB at B = 256; the fastest "
           "point runs FFT_TILING on two micro-batches of 128.", desirable, executes=False),
    Figure("9", "AlexNet's conv2 (forward) under each batch size policy",
           "conv2's forward convolution on P100-SXM2 within 64 MiB at B = 256: undivided, cuDNN picks GEMM "
           "(4.3 KiB of workspace) since FFT needs 213 MiB; powerOfTwo runs FFT on micro-batches of 32 (48.9 MiB); "
           "all adds Winograd, 2.33x faster than undivided.", policies),
)
