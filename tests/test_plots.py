"""The plots of `ucudnn optimize --plot`: every panel readable, every legend and title inside the
figure, one colour per thing named, and a default kernel whose Pareto front has something to show."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ucudnn.cli import main
from ucudnn.core.errors import ConfigError, install_extra
from ucudnn.core.nets import get_network
from ucudnn.measure.cache import recorded_path
from ucudnn.reports import plots

import synthetic
from test_report import report as reported

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
shipped = pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
MIB = 2**20


@pytest.fixture
def drawn(monkeypatch):
    """What `ucudnn optimize --plot` draws: the figure (not saved), and the kernel row and front it shows."""
    found = {}
    real = plots.plot_report

    def capture(report, row, front, path, title):
        found.update(report=report, row=row, front=front, figure=real(report, row, front, None, title))
        return found["figure"]

    monkeypatch.setattr("ucudnn.cli.commands.plot_report", capture)
    return found


def plan(tmp_path, *args: str) -> None:
    assert main(["optimize", "--offline", *args, "--plot", str(tmp_path / "plan.png")]) == 0


def _inside(box, figure_box, tolerance: float = 1.0) -> bool:
    return (box.x0 >= figure_box.x0 - tolerance and box.y0 >= figure_box.y0 - tolerance
            and box.x1 <= figure_box.x1 + tolerance and box.y1 <= figure_box.y1 + tolerance)


@shipped
@pytest.mark.parametrize("args", [("--net", "alexnet", "--workspace", "64MiB", "--kernel", "conv2/F"),
                                  ("--net", "alexnet", "--optimizer", "wd", "--total-workspace", "120MiB"),
                                  ("--net", "resnet50", "--batch", "32", "--optimizer", "wd",
                                   "--total-workspace", "1GiB")])
def test_every_panel_legend_and_title_fits_the_figure(capsys, tmp_path, drawn, args):
    """Candidate names run to 50 characters (engines:eng67_k2=0_k13=0_...): their legend must not
    squash the panels beside it nor run off the figure."""
    plan(tmp_path, *args)
    figure = drawn["figure"]
    renderer = FigureCanvasAgg(figure).get_renderer()  # the figure is pyplot's no more: no canvas of its own
    figure.draw(renderer)
    whole = figure.bbox
    for ax in figure.axes:
        if ax.axison:  # a panel, not the candidates' legend
            assert ax.bbox.width > 0.3 * whole.width, ax.get_title()
        texts = [ax.title, *([ax.get_legend()] if ax.get_legend() else [])]
        for artist in texts:
            assert _inside(artist.get_window_extent(renderer), whole), (ax.get_title(), artist)
    assert _inside(figure._suptitle.get_window_extent(renderer), whole)


@pytest.mark.parametrize("draw", [plots.draw_layer_times, plots.draw_division])
def test_a_stack_of_many_parts_has_a_legend_of_distinct_colours(draw):
    """ResNet-50 has 23 distinct layers and 69 distinct kernels: the largest stand apart, the
    rest are one "others" part, so every part shown has a colour of its own and a legend entry."""
    kernels = get_network("resnet50").problems(32)
    tables = {k.problem.key: synthetic.table(k.problem) for k in kernels}
    report = reported(kernels, tables, total_limit="200MiB")
    ax = Figure().subplots()
    draw(ax, report)
    legend = ax.get_legend()
    assert legend is not None
    colours = [tuple(handle.get_facecolor()) for handle in legend.legend_handles]
    assert len(set(colours)) == len(colours) <= 10
    assert legend.get_texts()[-1].get_text().endswith("others")


@shipped
@pytest.mark.parametrize("args", [("--net", "resnet50", "--batch", "32", "--optimizer", "wd", "--total-workspace",
                                   "1GiB"),
                                  ("--net", "googlenet", "--workspace", "64MiB")])
def test_the_default_kernel_is_the_one_the_plan_speeds_up_most(capsys, tmp_path, drawn, args):
    plan(tmp_path, *args)
    report, row = drawn["report"], drawn["row"]
    saved = lambda r: r.kernel.count * (r.undivided.time_ms - r.configuration.time_ms)  # noqa: E731
    assert saved(row) == max(saved(r) for r in report.rows) > 0
    assert len(drawn["front"]) > 2


def test_plots_without_matplotlib_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import matplotlib.figure raises ImportError
    with pytest.raises(ConfigError, match=re.escape(f"plots need matplotlib: {install_extra('plot')}")):
        plots.check_plot_path("plan.png")


def test_plotting_leaves_pyplot_and_the_backend_alone_and_returns_the_figure(tmp_path):
    """A notebook's backend is its user's: plots draw on a Figure of their own (not through
    pyplot, whose switch to Agg changed it), return it, and save it only where asked."""
    script = f"""
import sys
import matplotlib
matplotlib.use("svg")
from matplotlib.figure import Figure
from test_wd import MiB, Measured, _table, wd
from ucudnn.reports import plots
result = wd([Measured("small", _table(MiB), 4), Measured("big", _table(MiB, scale=10), 4)], (1, 2, 4), 6 * MiB)
assert isinstance(plots.plot_division(result, title="test"), Figure)
assert isinstance(plots.plot_division(result, {str(tmp_path / "d.png")!r}, "test"), Figure)
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "False"]
    assert [path.name for path in tmp_path.iterdir()] == ["d.png"]  # saved where asked, and only there
    assert (tmp_path / "d.png").read_bytes().startswith(b"\x89PNG")
