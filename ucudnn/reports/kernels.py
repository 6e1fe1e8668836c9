"""Where a converted model's time goes, kernel by kernel: from a planner's summary()
(`ucudnn.torch.context_of(model).summary()`), the room each kernel's moment left, ucudnn's limit
and plan, and the framework's own kernel beside it, as timed apart and as it ran in the step; as
a Markdown table (`table`) and as a plot (`plot_kernels`, needs matplotlib)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .plots import MIB, new_figure, saved

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = ("kind", "kernel", "room MiB", "limit MiB", "ucudnn plan", "workspace MiB", "predicted ms", "torch ms",
           "torch in the step ms", "its windows ms (flushes, grown)", "cuDNN's favourite ms", "torch workspace MiB", "runs",
           "flushes a step")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def _windows(windows) -> str:
    """A kernel's group's windows in its observed calls, in call order, with the allocator's
    flushes and the memory it took from the device inside each where any: '0.98 (1, 2), 0.62'."""
    return ", ".join(f"{ms:.2f}" + (f" ({flushes}, {sum(grown)})" if flushes or any(grown) else "")
                     for ms, flushes, *grown in windows) or "-"  # a summary before `grown` holds two a window


def _row(k: Mapping, flushes: Mapping[str, int]) -> str:
    nan = math.nan
    cells = (k["kind"], k["kernel"][:60], _mib(k.get("room")), _mib(k.get("limit")), k.get("configuration", k["via"]),
             _mib(k.get("workspace")), f"{k.get('predicted_ms', nan):.3f}", f"{k.get('own_ms', nan):.3f}",
             f"{k.get('in_step_ms', nan):.3f}", _windows(k.get("in_step_windows", ())),
             f"{k.get('favourite_ms', nan):.3f}", _mib(k.get("own_workspace")),
             "torch" if k["delegated"] else k["via"], flushes.get(k["kernel"], "-"))
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(summary: Mapping, flushes: Mapping[str, int] | None = None) -> str:
    """The summary's kernels as a Markdown table, then the flush watch and the shrinks;
    `flushes`: the allocator's flushes in one step by kernel name, where they were counted."""
    flushes = flushes or {}
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [_row(k, flushes) for k in summary.get("kernels", [])]
    if summary.get("flush_watch"):
        watch = summary["flush_watch"]
        lines.append(f"\nThe flush watch: {watch['watched']} of {watch['steps']} steps watched; kept as planned "
                     f"although they flushed: {', '.join(k[:60] for k in watch['kept']) or 'none'}.")
    lines += [f"- shrunk: {s['kernel'][:60]}, {s['failed'] / MIB:.0f} -> {s['limit'] / MIB:.0f} MiB "
              f"({s.get('why', '?')})" for s in summary.get("shrinks", [])]
    return "\n".join(lines)


def plot_kernels(summary: Mapping, path: str | Path | None = None, title: str = "") -> Figure:
    """The summary's kernels in planning order: above, the room each one's moment left, ucudnn's
    limit and the workspace of the plan that runs (ucudnn's, or the framework's where its layer is
    delegated); beneath, the framework's time at that moment against ucudnn's predicted time."""
    kernels = summary["kernels"]
    x = list(range(len(kernels)))
    figure = new_figure(figsize=(max(8, len(kernels) * 0.35), 6.5))
    memory, times = figure.subplots(2, 1, sharex=True)
    mib = lambda key: [(k.get(key) or 0) / MIB for k in kernels]  # noqa: E731
    runs = [k.get("own_workspace", math.nan) / MIB if k["delegated"] or k["via"] != "ucudnn"
            else (k.get("workspace") or 0) / MIB for k in kernels]
    memory.bar(x, mib("room"), color="#cfe2f3", label="room: free at its moment, beside its output")
    memory.plot(x, mib("limit"), "k_", markersize=10, label="ucudnn's limit (room less the margin)")
    memory.bar(x, runs, width=0.4, color=["#999999" if k["delegated"] else "#1f77b4" for k in kernels],
               label="workspace of the plan that runs (grey: the framework's own, delegated)")
    memory.set_yscale("symlog", linthresh=1)
    memory.set_ylabel("MiB")
    memory.legend(fontsize=7, loc="upper right")
    memory.set_title(title, fontsize=9)
    times.plot(x, [k.get("own_ms", math.nan) for k in kernels], "o", color="#999999",
               label="the framework's kernel at that moment, timed apart")
    times.plot(x, [k.get("in_step_ms", math.nan) for k in kernels], "^", color="#999999", fillstyle="none",
               label="the framework's kernels in the step (F; BD and BF together)")
    times.plot(x, [k.get("predicted_ms", math.nan) for k in kernels], "x", color="#1f77b4",
               label="ucudnn's plan (predicted)")
    times.set_yscale("log")
    times.set_ylabel("ms")
    times.legend(fontsize=7)
    times.set_xticks(x, [k["kind"] for k in kernels], fontsize=6)
    return saved(figure, path)
