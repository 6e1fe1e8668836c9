"""The paper's evaluation (section IV) figure by figure, now: each figure computed as ucudnn plans
(evidence.py: predicted from recorded measurements, or executed on this GPU) and written as a
Markdown page beside a PNG, its numbers beside those the paper reports (page.py); with every figure,
an index of them all. `ucudnn paper FIG` is the command; FIGURES the registry, by number."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..core.progress import counted
from ..reports.plots import check_plot_path
from . import division, kernels, networks
from .evidence import CANDIDATES, Evidence, Executed, Predicted
from .page import Figure, Headline, Result, headline_table, write

__all__ = ["CANDIDATES", "FIGURES", "Evidence", "Executed", "Figure", "Headline", "Predicted", "Result",
           "index_page", "write_figures"]

FIGURES: dict[str, Figure] = {f.number: f for f in (*kernels.FIGURES, *networks.FIGURES, *division.FIGURES)}
INDEX = "README.md"


def write_figures(numbers: Iterable[str], evidence: Evidence, out: Path) -> tuple[dict[str, Result], list[Path]]:
    """Each figure `numbers` names computed and written into folder `out` (made where missing): the
    results by number, and the files written. Every figure, predicted, also writes the index.
    The evidence's progress line says which figure is being made, once the work takes long."""
    numbers = list(numbers)
    check_plot_path(out / "fig.png")  # matplotlib, before any planning
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Result] = {}
    paths: list[Path] = []
    for number in numbers:
        evidence.stage = f"Fig. {number}, {len(results)} of {len(numbers)} figures done"
        results[number] = FIGURES[number].make(evidence)
        evidence.line.step("writing its page and drawing", evidence.stage)
        paths += write(FIGURES[number], results[number], evidence, out)
    if set(results) == set(FIGURES) and not evidence.executed:
        paths.append(out / INDEX)
        paths[-1].write_text(index_page(results, evidence, out), encoding="utf-8")
    evidence.line.finished()
    evidence.line.close(lambda: counted(len(numbers), "figure"))
    return results, paths


def index_page(results: dict[str, Result], evidence: Evidence, out: Path) -> str:
    """The index of folder `out`: every figure's page, predicted and executed where there is one,
    and the headlines of `results`."""
    rows = []
    for number, figure in FIGURES.items():
        rows.append(f"| Fig. {number} | {figure.title} | [{figure.stem(evidence)}.md]({figure.stem(evidence)}.md) | "
                    f"{figure.executed_cell(evidence, out)} |")
    headlines = [(f"Fig. {number}", h) for number, result in results.items() for h in result.headlines]
    return "\n".join([
        "# The paper's evaluation, figure by figure", "",
        "μ-cuDNN (Oyama et al., 2018) evaluates its micro-batching on K80, P100-SXM2 and V100-SXM2 GPUs with "
        "cuDNN 6 and 7, in Caffe and TensorFlow. Each page here sets one figure of its section IV beside the "
        f"same computation now, {evidence.describe()}, planned as `ucudnn optimize` plans: with "
        f"{CANDIDATES['legacy']} alone (the API the paper's cuDNN had) and with {CANDIDATES['all']} "
        "(ucudnn's default). The paper's numbers are the P100-SXM2's its text reports.", "",
        "`ucudnn paper all` (no GPU needed) writes every predicted page, its PNG and this index; "
        "`ucudnn paper FIG --execute` on a GPU measures what the recording lacks and runs every configuration "
        "as the handle runs it, as the paper executed its figures, into figFIG-executed.md and .png "
        "(`bash bench/gpu_suite.sh paper` runs them all).", "",
        "| figure | what | predicted | executed |", "|---|---|---|---|", *rows, "",
        "## Every headline: the paper beside now", "",
        headline_table(headlines), "",
        "Throughout: now counts the convolution kernels only, where the paper timed whole training iterations "
        "(and gives convolution-only ratios for Caffe); times are predicted (sums of measured micro-batches, "
        "graph execution) unless a page says executed; fp32 with cuDNN's default math, which allows TF32 on the "
        "H100's tensor cores (the recording has no FMA-only measurements to separate them); AlexNet is Caffe's "
        "single-column model throughout. Each page's notes say where its numbers differ from the paper's.", ""])
