"""The paper's figures from a report: a kernel's desirable configurations (Fig. 8), per-layer times
(Fig. 10) and WD's division of the workspace (Fig. 14); and the drawings of ucudnn.paper: panels of
stacked bars and named configurations as rows of micro-batches (Fig. 9). Needs matplotlib. Each plot is drawn on a
matplotlib Figure of its own, never through pyplot (whose backend and current figure are the
user's, in a notebook say), returned, and saved where a path is given."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from ..core.errors import ConfigError, install_extra
from ..optimizers.configuration import Configuration
from ..plan.config import format_size
from .report import KernelReport, Report

MIB = 2**20
LEGEND_COLUMNS = 2  # of candidate names, which run to 50 characters: two columns fit the figure's width
STACKED_PARTS = 10  # parts a stacked bar shows apart (the rest as one): one colour each
STACKED_COLUMNS = 3  # of the legend below a stacked bar: layer names run to 25 characters
OTHERS = "others"
ROTATED_BARS = 10  # a panel of more bars than this names them vertically  # the part of a stacked bar that sums the smaller ones: "12 others"


def new_figure(**options) -> Figure:
    """A new matplotlib Figure, outside pyplot; ConfigError saying how to install matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(f"plots need matplotlib: {install_extra('plot')}") from None
    return Figure(layout="constrained", **options)


def check_plot_path(path: str | Path) -> None:
    """A ConfigError, before any planning, for a file name whose extension matplotlib cannot write."""
    new_figure()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = Path(path).suffix.lower().lstrip(".")
    if extension not in formats:
        what = f"extension .{extension} is not a plot format" if extension else "has no extension"
        raise ConfigError(f"plot file {path}: {what}; end it in .png, .pdf, .svg or another of "
                          f"{', '.join(sorted(formats))}")


def _titled(title: str, what: str) -> str:
    return f"{title}: {what}" if title else what


def saved(figure: Figure, path: str | Path | None) -> Figure:
    """`figure`, written to `path` first unless that is None."""
    if path is None:
        return figure
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose a writable path") from None
    return figure


def draw_front(points_ax, parts_ax, legend_ax, row: KernelReport, front: list[Configuration], limit: int) -> None:
    """Fig. 8: the desirable configurations in (workspace, time), the report's choice starred, and
    each one's micro-batches as a row of boxes coloured by candidate, named in `legend_ax`."""
    workspace = [c.workspace / MIB for c in front]
    time = [c.time_ms for c in front]
    points_ax.step(workspace, time, where="post", color="0.75", zorder=1)
    points_ax.scatter(workspace, time, zorder=2, label="desirable")
    points_ax.scatter([row.configuration.workspace / MIB], [row.configuration.time_ms], marker="*", s=250,
                      color="C3", zorder=3, label="plan")
    # the front, not a limit far beyond it, sets the scale: a limit past twice the widest point is off the axis
    widest = max(workspace, default=0.0)
    shown = limit / MIB <= 2 * widest
    points_ax.axvline(limit / MIB, color="C7", linestyle="--",
                      label=f"limit {format_size(limit)}" + ("" if shown else " (off the axis)"))
    points_ax.set_xlim(-0.05 * widest, 1.05 * (limit / MIB if shown else widest) or 1)
    points_ax.set(xlabel="workspace (MiB)", ylabel="time (ms, predicted)", title=f"{row.kernel.name}: Pareto front")
    points_ax.legend()
    candidates = _draw_parts(parts_ax, front)
    parts_ax.set_yticks(range(len(front)), [format_size(c.workspace) for c in front])
    parts_ax.set(xlabel="samples", title="micro-batches of each desirable configuration")
    legend_ax.axis("off")
    legend_ax.legend(handles=candidates, loc="upper center", ncol=LEGEND_COLUMNS, fontsize="small",
                     title="candidates (colours of the micro-batches)", title_fontsize="small")


def _draw_parts(ax, front: list[Configuration], width=lambda m: m.batch, sizes: bool = False) -> list:
    """Configuration y as a row of boxes, one per micro-batch, `width(micro)` wide (its samples),
    one colour per candidate (one collection per candidate: fronts have hundreds of boxes), with
    `sizes` each box labelled with its samples; the collections, to name in a legend."""
    from matplotlib.collections import PolyCollection

    boxes: dict[str, list] = {}
    for y, configuration in enumerate(front):
        left = 0
        for m in configuration.micro:
            right = left + width(m)
            boxes.setdefault(m.algo, []).append([(left, y - 0.4), (right, y - 0.4), (right, y + 0.4), (left, y + 0.4)])
            if sizes:
                ax.annotate(str(m.batch), ((left + right) / 2, y), ha="center", va="center", fontsize="x-small")
            left = right
    # thin edges: a configuration of 256 one-sample boxes stays its colour, not the edges' white
    colours = _colours(len(boxes))
    collections = [ax.add_collection(PolyCollection(polygons, facecolor=colour, edgecolor="white",
                                                    linewidth=0.3, label=algo))
                   for colour, (algo, polygons) in zip(colours, sorted(boxes.items()))]
    ax.autoscale_view()
    return collections


def _colours(count: int) -> list:
    """`count` colours, all distinct up to 20."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    return [palette(i % palette.N) for i in range(count)]


def _by_layer(report: Report, which: str) -> dict[str, float]:
    """Milliseconds per layer (its kernels, every occurrence) of the report or a reference."""
    times: dict[str, float] = {}
    for row in report.rows:
        times[row.kernel.layer] = times.get(row.kernel.layer, 0.0) + row.kernel.count * getattr(row, which).time_ms
    return times


def _largest_parts(bars: dict[str, dict[str, float]], most: int) -> dict[str, dict[str, float]]:
    """`bars` with at most `most` parts: the largest (summed over the bars) each as they are, in
    their order, and the rest summed as one last part, "N others"."""
    parts = list(next(iter(bars.values())))
    if len(parts) <= most:
        return bars
    largest = set(sorted(parts, key=lambda part: sum(segments[part] for segments in bars.values()))[-(most - 1):])
    others = f"{len(parts) - len(largest)} {OTHERS}"
    return {bar: {**{part: value for part, value in segments.items() if part in largest},
                  others: sum(value for part, value in segments.items() if part not in largest)}
            for bar, segments in bars.items()}


def _stacked(ax, bars: dict[str, dict[str, float]], unit: str) -> None:
    """One bar per entry of `bars`, stacked by its parts (same parts, same colours), each part in
    the legend below the panel: at most STACKED_PARTS of them, so that no two share a colour;
    the rest, if any, as one light grey part; none at all says so."""
    if not bars:
        ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
        return
    bars = _largest_parts(bars, STACKED_PARTS)
    parts = list(next(iter(bars.values())))
    bottoms = [0.0] * len(bars)
    for part, colour in zip(parts, _colours(len(parts))):
        values = [segments[part] for segments in bars.values()]
        grey = re.fullmatch(rf"\d+ {OTHERS}", part)
        ax.bar(list(bars), values, bottom=bottoms, label=part, color="lightgrey" if grey else colour,
               edgecolor="white", linewidth=0.5)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel(unit)
    ax.legend(fontsize="small", ncol=STACKED_COLUMNS, loc="upper center", bbox_to_anchor=(0.5, -0.14))


def draw_layer_times(ax, report: Report) -> None:
    """Fig. 10: predicted time per layer of cuDNN at the limit, the report, and the unlimited best."""
    _stacked(ax, {"cuDNN undivided": _by_layer(report, "undivided"),
                  f"μ-cuDNN {report.optimizer.upper()}": _by_layer(report, "configuration"),
                  "unlimited best": _by_layer(report, "best")}, "time per iteration (ms, predicted)")
    ax.set_title("per-layer times")


def draw_division(ax, report: Report) -> None:
    """Fig. 14: the workspace each kernel gets, cuDNN undivided at the per-kernel limit against WD's
    division."""
    def workspace(which: str) -> dict[str, float]:  # once per distinct kernel: repeats share it
        return {row.kernel.name: getattr(row, which).workspace / MIB for row in report.rows}

    _stacked(ax, {f"cuDNN undivided\n{report.kernel_limit / MIB:.1f} MiB each": workspace("undivided"),
                  f"WD\n{report.limit / MIB:.0f} MiB total": workspace("configuration")}, "workspace (MiB)")
    ax.set_title("workspace division")


def plot_report(report: Report, row: KernelReport, front: list[Configuration], path: str | Path | None = None,
                title: str = "") -> Figure:
    """One figure, saved to `path` (its extension the format) unless None: `row`'s Pareto front
    (`front`: its desirable set) with its candidates named below it, per-layer times and, for WD,
    the workspace division."""
    legend_inches = _legend_inches(front)
    figure = new_figure(figsize=(14, 9 + legend_inches))
    grid = figure.add_gridspec(3, 2, height_ratios=(4.5, legend_inches, 4.5))
    draw_front(figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1]), figure.add_subplot(grid[1, :]),
               row, front, report.limit)
    if report.optimizing.divides:
        draw_layer_times(figure.add_subplot(grid[2, 0]), report)
        draw_division(figure.add_subplot(grid[2, 1]), report)
    else:
        draw_layer_times(figure.add_subplot(grid[2, :]), report)
    figure.suptitle(title)
    return saved(figure, path)


def _legend_inches(configurations: list[Configuration]) -> float:
    """The height of a legend of the candidates of `configurations`: its title, then a line per row."""
    candidates = len({m.algo for c in configurations for m in c.micro})
    return 0.4 + 0.2 * -(-candidates // LEGEND_COLUMNS)


def plot_front(row: KernelReport, front: list[Configuration], limit: int, path: str | Path | None = None,
               title: str = "") -> Figure:
    """Fig. 8 alone, saved to `path` unless None: `row`'s desirable configurations `front` within
    `limit` bytes, its plan starred, each one's micro-batches, the candidates named below."""
    legend_inches, height = _legend_inches(front), max(4.5, 0.16 * len(front))  # a readable label per configuration
    figure = new_figure(figsize=(14, height + legend_inches))
    grid = figure.add_gridspec(2, 2, height_ratios=(height, legend_inches))
    draw_front(figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1]), figure.add_subplot(grid[1, :]),
               row, front, limit)
    figure.suptitle(title)
    return saved(figure, path)


def plot_configurations(configurations: dict[str, Configuration], path: str | Path | None = None,
                        title: str = "") -> Figure:
    """Fig. 9, saved to `path` unless None: a row per named configuration, a box per micro-batch
    as wide as its measured time and labelled with its samples, coloured by candidate."""
    legend_inches = _legend_inches(list(configurations.values()))
    figure = new_figure(figsize=(12, 1.5 + 0.6 * len(configurations) + legend_inches))
    grid = figure.add_gridspec(2, 1, height_ratios=(1 + 0.6 * len(configurations), legend_inches))
    ax, legend_ax = figure.add_subplot(grid[0]), figure.add_subplot(grid[1])
    candidates = _draw_parts(ax, list(configurations.values()), width=lambda m: m.time_ms, sizes=True)
    ax.set_yticks(range(len(configurations)), list(configurations))
    ax.invert_yaxis()
    ax.set(xlabel="time (ms): each micro-batch as measured, labelled with its samples", title=title)
    legend_ax.axis("off")
    legend_ax.legend(handles=candidates, loc="upper center", ncol=LEGEND_COLUMNS, fontsize="small",
                     title="candidates", title_fontsize="small")
    return saved(figure, path)


def plot_stacked(panels: dict[str, dict[str, dict[str, float]]], unit: str, path: str | Path | None = None,
                 title: str = "") -> Figure:
    """Panels of stacked bars, one above another (Figs. 1 and 10 to 14), saved to `path` unless
    None: in each panel a bar per entry, stacked by its parts (every bar of a panel has the same
    parts), as the per-layer times of `ucudnn optimize --plot` are."""
    widest = max(len(bars) for bars in panels.values())
    figure = new_figure(figsize=(max(8.0, 1.0 + 0.8 * widest), 0.5 + 5.0 * len(panels)))
    for ax, (name, bars) in zip(figure.subplots(len(panels), 1, squeeze=False)[:, 0], panels.items()):
        _stacked(ax, bars, unit)
        ax.set_title(name)
        if len(bars) > ROTATED_BARS:  # names run down from the bars; the legend moves inside the panel
            ax.tick_params(axis="x", labelrotation=90)
            ax.legend(fontsize="small", ncol=STACKED_COLUMNS, loc="upper right")
    figure.suptitle(title)
    return saved(figure, path)


def plot_division(result, path: str | Path | None = None, title: str = "") -> Figure:
    """Fig. 14 from a WDResult, saved to `path` unless None: each kernel's segment of the
    network's workspace buffer, as a bar from its offset to its end, labelled with its configuration."""
    names = list(result.segments)
    figure = new_figure(figsize=(12, 1.5 + 0.3 * len(names)))
    ax = figure.subplots()
    segments = [result.segments[n] for n in names]
    ax.barh(range(len(names)), [s.size / MIB for s in segments], left=[s.offset / MIB for s in segments],
            color=[f"C{i % 10}" for i in range(len(names))])
    for y, name in enumerate(names):
        ax.annotate(f" {result.configurations[name].describe()}", (segments[y].end / MIB, y),
                    va="center", fontsize="small")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="offset in the workspace buffer (MiB)",
           xlim=(0, max(result.total_workspace / MIB, 1e-3) * 1.25),
           title=_titled(title, f"{format_size(result.total_workspace)} in {len(names)} segments"))
    return saved(figure, path)


def plot_schedule(plan, path: str | Path | None = None, title: str = "") -> Figure:
    """A stream schedule (ucudnn.core.schedule.Schedule) as a Gantt chart, saved to `path` unless None:
    a row per stream, a bar per node from its predicted start to its end, the critical path's
    nodes outlined."""
    critical = set(plan.critical_path)
    figure = new_figure(figsize=(12, 1.5 + 0.5 * plan.streams))
    ax = figure.subplots()
    for stream, names in plan.order.items():
        for i, name in enumerate(names):
            p = plan.placements[name]
            ax.barh(stream, p.end_ms - p.start_ms, left=p.start_ms, color=f"C{i % 10}",
                    edgecolor="black" if name in critical else "none", linewidth=1.5)
            ax.annotate(name, ((p.start_ms + p.end_ms) / 2, stream), ha="center", va="center", fontsize="x-small")
    ax.set_yticks(list(plan.order), [f"stream {s}" for s in plan.order])
    ax.invert_yaxis()
    ax.set(xlabel="predicted time (ms)", title=_titled(title, f"{plan.makespan_ms:.3f} ms on {plan.streams} "
                                                       f"streams (critical path {plan.critical_ms:.3f} ms, outlined)"))
    return saved(figure, path)
