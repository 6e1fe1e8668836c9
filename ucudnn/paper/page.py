"""What a figure of the paper says now (ucudnn.paper): its tables, its headlines beside the
paper's (`Headline`), the notes on where they differ, and its drawing; written as a Markdown page
beside a PNG, and the index of every figure's headlines."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .evidence import CANDIDATES, DRAWN, Evidence

if TYPE_CHECKING:
    from matplotlib.figure import Figure as Drawing

NOT_RECORDED = "not in the measurements"
SHORT = {"undivided": "u", "powerOfTwo": "p", "all": "a"}  # the paper's labels of the batch size policies


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def against(value: float, paper: float, shown=ratio) -> str:
    """'above the paper's 4.51x': how a number of now (a ratio unless `shown` says otherwise)
    stands to the paper's, as shown."""
    side = "as" if shown(value) == shown(paper) else "above" if value > paper else "below"
    return f"{side} the paper's {shown(paper)}"


@dataclass(frozen=True)
class Headline:
    """A number the paper's text reports (`paper`, as it reports it) beside today's, one per
    candidate set (evidence.CANDIDATES, in order)."""

    what: str
    paper: str
    now: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple, ...]

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.headers) + " |",
                 "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(map(str, row)) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass
class Result:
    """A figure computed: tables, headlines, notes (sentences on where and why now differs from the
    paper, each stating only what the numbers above show) and `draw(path)`, which saves the PNG."""

    tables: list[Table]
    headlines: list[Headline]
    notes: list[str]
    draw: Callable[[Path | None], Drawing]
    missing: list[str] = field(default_factory=list)  # `ucudnn bench` commands of what the measurements lack


@dataclass(frozen=True)
class Figure:
    """A figure of the paper's section IV: its number, title, the paper's setting in a sentence,
    and `make(evidence)`, which computes it now."""

    number: str
    title: str
    paper: str
    make: Callable[[Evidence], Result]
    executes: bool = True  # whether the paper timed it running; else it is a plan from measurements

    def executed_cell(self, evidence: Evidence, out: Path) -> str:
        """Its executed page in the index of folder `out`: a link where one is written, else the
        command that writes it, or, for a plan (a desirable set, a division), that the paper's
        figure was one too: its page from measurements is the figure."""
        stem = f"{self.stem(evidence)}-executed"
        if (out / f"{stem}.md").exists():
            return f"[{stem}.md]({stem}.md)"
        if not self.executes:
            return "none: a plan from measurements, as the paper's figure is"
        return f"not yet produced: `ucudnn paper {self.number} --execute` on a GPU"

    def stem(self, evidence: Evidence) -> str:
        """fig9 (predicted) or fig9-executed."""
        return f"fig{self.number}" + (f"-{evidence.label}" if evidence.executed else "")

    def command(self, evidence: Evidence) -> str:
        """The command that writes its page from `evidence`."""
        return f"ucudnn paper {self.number}{evidence.flags}"


def headline_table(rows: Sequence[tuple[str, Headline]]) -> str:
    """Headlines (each with its figure's label) as a Markdown table, paper beside now."""
    now = [f"now: {CANDIDATES[name]}" for name in CANDIDATES]
    lines = ["| figure | what | paper (P100-SXM2) | " + " | ".join(now) + " |", "|---|---|---|" + "---|" * len(now)]
    lines += [f"| {figure} | {h.what} | {h.paper} | " + " | ".join(h.now) + " |" for figure, h in rows]
    return "\n".join(lines)


def markdown(figure: Figure, result: Result, evidence: Evidence) -> str:
    stem = figure.stem(evidence)
    parts = [f"# Fig. {figure.number}: {figure.title}", "",
             f"**The paper:** {figure.paper}", "",
             f"**Now:** {evidence.describe()}; {evidence.timing()}; fp32, cuDNN's default math (which allows "
             f"TF32); convolutions only. The drawing plans with "
             f"{CANDIDATES[DRAWN]}. `{figure.command(evidence)}` writes this page and {stem}.png.", "",
             f"![Fig. {figure.number} now]({stem}.png)", ""]
    for table in result.tables:
        parts += [table.markdown(), ""]
    parts += ["## The paper beside now", "", headline_table([(f"Fig. {figure.number}", h) for h in result.headlines]),
              "", "**Where they differ:** " + " ".join(result.notes)]
    if result.missing:
        parts += ["", f"Cells marked \"{NOT_RECORDED}\" need measurements the recording lacks; on a GPU: "
                  + "; ".join(f"`{command}`" for command in result.missing) + "."]
    return "\n".join(parts) + "\n"


def write(figure: Figure, result: Result, evidence: Evidence, out: Path) -> list[Path]:
    """The page and the PNG of `figure` in folder `out`."""
    stem = figure.stem(evidence)
    page, png = out / f"{stem}.md", out / f"{stem}.png"
    result.draw(png)
    page.write_text(markdown(figure, result, evidence), encoding="utf-8")
    return [page, png]
