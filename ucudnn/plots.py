"""The paper's figures from a report: a kernel's desirable configurations (Fig. 8), per-layer times
(Fig. 10) and WD's division of the workspace (Fig. 14). Needs matplotlib; draws off-screen."""
from __future__ import annotations

from pathlib import Path

from .config import format_size
from .errors import ConfigError
from .optimizers.configuration import Configuration
from .report import KernelReport, Report

MIB = 2**20


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib; install it: pip install 'ucudnn[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: str | Path) -> None:
    """A ConfigError, before any planning, for a file name whose extension matplotlib cannot write."""
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    extension = Path(path).suffix.lower().lstrip(".")
    if extension not in formats:
        what = f"extension .{extension} is not a plot format" if extension else "has no extension"
        raise ConfigError(f"plot file {path}: {what}; end it in .png, .pdf, .svg or another of "
                          f"{', '.join(sorted(formats))}")


def _save(figure, path: str | Path) -> None:
    try:
        figure.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}; choose a writable path") from None
    finally:
        _pyplot().close(figure)


def draw_front(points_ax, parts_ax, row: KernelReport, front: list[Configuration], limit: int) -> None:
    """Fig. 8: the desirable configurations in (workspace, time), and each one's micro-batches
    as a bar coloured by algorithm; the report's choice starred."""
    workspace = [c.workspace / MIB for c in front]
    time = [c.time_ms for c in front]
    points_ax.step(workspace, time, where="post", color="0.75", zorder=1)
    points_ax.scatter(workspace, time, zorder=2, label="desirable")
    points_ax.scatter([row.configuration.workspace / MIB], [row.configuration.time_ms], marker="*", s=250,
                      color="C3", zorder=3, label="plan")
    points_ax.axvline(limit / MIB, color="C7", linestyle="--", label=f"limit {limit / MIB:.0f} MiB")
    points_ax.set(xlabel="workspace (MiB)", ylabel="time (ms, predicted)", title=f"{row.kernel.name}: Pareto front")
    points_ax.legend()
    _draw_parts(parts_ax, row, front)
    parts_ax.set_yticks(range(len(front)), [format_size(c.workspace) for c in front])
    parts_ax.set(xlabel="samples", title="micro-batches of each desirable configuration")


def _draw_parts(ax, row: KernelReport, front: list[Configuration]) -> None:
    """Configuration y as a row of boxes, one per micro-batch, one colour per algorithm (one
    collection per algorithm: fronts have hundreds of boxes)."""
    from matplotlib.collections import PolyCollection

    boxes: dict[int, list] = {}
    for y, configuration in enumerate(front):
        left = 0
        for m in configuration.micro:
            boxes.setdefault(m.algo, []).append(
                [(left, y - 0.4), (left + m.batch, y - 0.4), (left + m.batch, y + 0.4), (left, y + 0.4)])
            left += m.batch
    for i, (algo, polygons) in enumerate(sorted(boxes.items())):
        ax.add_collection(PolyCollection(polygons, facecolor=f"C{i % 10}", edgecolor="white",
                                         label=algo))
    ax.autoscale_view()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize="small")


def _by_layer(report: Report, which: str) -> dict[str, float]:
    """Milliseconds per layer (its kernels, every occurrence) of the report or a reference."""
    times: dict[str, float] = {}
    for row in report.rows:
        times[row.kernel.layer] = times.get(row.kernel.layer, 0.0) + row.kernel.count * getattr(row, which).time_ms
    return times


def _stacked(ax, bars: dict[str, dict[str, float]], unit: str, legend_max: int = 20) -> None:
    """One bar per entry of `bars`, stacked by its parts (same parts, same colours)."""
    from matplotlib import colormaps

    parts = list(next(iter(bars.values())))
    palette = colormaps["tab10" if len(parts) <= 10 else "tab20"]
    bottoms = [0.0] * len(bars)
    for i, part in enumerate(parts):
        values = [segments[part] for segments in bars.values()]
        ax.bar(list(bars), values, bottom=bottoms, label=part, color=palette(i % palette.N),
               edgecolor="white", linewidth=0.5)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel(unit)
    if len(parts) <= legend_max:
        ax.legend(fontsize="small", ncol=2)


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


def plot_report(report: Report, row: KernelReport, front: list[Configuration], path: str | Path, title: str) -> None:
    """One PNG: `row`'s Pareto front (`front`: its desirable set), per-layer times and, for WD,
    the workspace division."""
    plt = _pyplot()
    figure = plt.figure(figsize=(14, 10), layout="constrained")
    grid = figure.add_gridspec(2, 2)
    draw_front(figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1]), row, front, report.limit)
    if report.optimizer == "wd":
        draw_layer_times(figure.add_subplot(grid[1, 0]), report)
        draw_division(figure.add_subplot(grid[1, 1]), report)
    else:
        draw_layer_times(figure.add_subplot(grid[1, :]), report)
    figure.suptitle(title)
    _save(figure, path)


def plot_division(result, path: str | Path, title: str) -> None:
    """Fig. 14 from a WDResult: each kernel's segment of the network's workspace buffer, as a bar
    from its offset to its end, labelled with its configuration."""
    plt = _pyplot()
    names = list(result.segments)
    figure, ax = plt.subplots(figsize=(12, 1.5 + 0.3 * len(names)), layout="constrained")
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
           title=f"{title}: {format_size(result.total_workspace)} in {len(names)} segments")
    _save(figure, path)
