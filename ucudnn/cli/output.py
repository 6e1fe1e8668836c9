"""What commands print: a progress line, text tables, the optimize report and JSON."""
from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict

from ..core.device import Provenance
from ..core.log import say
from ..core.nets import Network
from ..plan.config import format_size
from ..reports.report import Report


class ProgressBar:
    """One line through the `ucudnn` logger (ucudnn.core.log: stderr, updated in place on a terminal):
    kernels done, time left and the kernel being measured."""

    def __init__(self, names: dict[str, str], width: int = 24):
        self.names, self.width = names, width
        self.start = time.monotonic()

    def __call__(self, done: int, total: int, problem) -> None:
        if done == 0:  # a run of measuring starts (a figure may measure in several)
            self.start = time.monotonic()
        elapsed = time.monotonic() - self.start
        left = f"{elapsed / done * (total - done):.0f} s left" if done else "time left unknown"
        current = "done" if done == total else self.names.get(problem.key, problem.describe())
        bar = "#" * (self.width * done // max(total, 1))
        say(f"[{bar:<{self.width}}] {done}/{total} kernels, {left}, {current}", redrawn=done < total)


_NUMBER = re.compile(r"[\d.]+x?( [A-Za-z]+)?")


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """Columns padded to their widest cell; a column of numbers (with a unit or x, or empty) is
    right-aligned."""
    cells = [[str(c) for c in row] for row in (headers, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_NUMBER.fullmatch(row[i]) for row in cells[1:] if row[i]) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric))
                     .rstrip() for row in cells)


def dims(values) -> str:
    return "x".join(map(str, values))


def ms(value: float) -> str:
    return f"{value:.3f}"


def render_report(network: Network, report: Report, args, device: Provenance, measured: bool, path) -> str:
    where = "measured here" if measured else "recorded"
    optimizer = report.optimizing
    limit = f"{optimizer.label}, {format_size(report.limit)} {'in total' if optimizer.divides else 'per kernel'}"
    rows = [(r.kernel.name, r.kernel.count, r.describe(r.configuration), ms(r.configuration.time_ms),
             format_size(r.configuration.workspace), ms(r.undivided.time_ms), f"{r.speedup:.2f}x",
             ms(r.best.time_ms)) for r in report.rows]
    rows.append(("total", sum(r.kernel.count for r in report.rows), "", ms(report.time_ms()),
                 format_size(report.workspace), ms(report.time_ms("undivided")), f"{report.speedup:.2f}x",
                 ms(report.time_ms("best"))))
    lines = [
        f"{network.name}: {network.description}",
        f"batch {args.batch}, {args.dtype}, {args.layout}, math {args.math}; policy {report.policy}; {limit}",
        f"times are predicted from measurements {where} on {device.describe()} (database {path})",
        "",
        table(("kernel", "n", "configuration", "ms", "workspace", "cuDNN ms", "speedup", "best ms"), rows),
        "",
        f"speedup over cuDNN undivided at {format_size(report.kernel_limit)} per kernel: {report.speedup:.2f}x "
        f"({ms(report.time_ms('undivided'))} -> {ms(report.time_ms())} ms per iteration, predicted)",
        f"unlimited best (cuDNN undivided, no workspace limit): {ms(report.time_ms('best'))} ms with "
        f"{format_size(report.reference_workspace('best'))}; the plan takes {report.gap_to_best:.2f}x its time",
        "n: occurrences in the network; totals count the time of each, the workspace of each distinct kernel once",
    ]
    if report.solver:
        s = report.solver
        lines.append(f"WD: {s['variables']} binary variables, built in {s['build_seconds']:.3f} s, "
                     f"solved by {s['solver']} in {s['solve_seconds']:.3f} s")
    return "\n".join(lines)


def device_json(device: Provenance) -> dict:
    return {**asdict(device), "description": device.describe()}


def print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))
