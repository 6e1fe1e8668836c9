"""`ucudnn paper FIG`: every figure of the paper's evaluation written from the shipped measurements
(a page and a PNG each, the paper's numbers beside today's, and the index), docs/paper as the
command writes it now, and the executed path: run on a stand-in GPU here, refused without one."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ucudnn.cli import main
from ucudnn.measure.cache import recorded_path
from ucudnn.paper import CANDIDATES, FIGURES, Executed, Predicted, index_page, write_figures
from ucudnn.paper.page import NOT_RECORDED, headline_table
from ucudnn.plan.config import Settings

from fakes import FakeBenchmarker

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from test_plots import _inside  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "paper"
shipped = pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
# what changes from run to run: the ILP solver's seconds
VOLATILE = re.compile(r"\d+\.\d+ ms \(CBC")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every figure and the index, predicted from the shipped measurements (as `ucudnn paper all`),
    into a folder holding the executed pages docs/paper holds (a GPU wrote them; the index links them)."""
    if recorded_path() is None:
        pytest.skip("no recorded measurements are shipped in cache/ yet")
    out = tmp_path_factory.mktemp("paper")
    for executed in DOCS.glob("*-executed.md"):
        shutil.copy(executed, out)
    with Predicted(Settings()) as evidence:
        results, paths = write_figures(FIGURES, evidence, out)
    return out, results, paths


def test_the_paper_has_eight_figures_of_its_evaluation():
    assert list(FIGURES) == ["1", "8", "9", "10", "11", "12", "13", "14"]


@pytest.mark.slow
def test_every_figure_writes_a_page_a_png_and_the_index_links_them(written):
    out, _, paths = written
    assert sorted(p.name for p in paths) == sorted([f"fig{n}.{ext}" for n in FIGURES for ext in ("md", "png")]
                                                   + ["README.md"])
    index = (out / "README.md").read_text()
    for number in FIGURES:
        assert (out / f"fig{number}.png").read_bytes().startswith(b"\x89PNG")
        page = (out / f"fig{number}.md").read_text()
        assert f"![Fig. {number} now](fig{number}.png)" in page and "predicted" in page
        assert f"[fig{number}.md](fig{number}.md)" in index
        executed = f"[fig{number}-executed.md](fig{number}-executed.md)" if (out / f"fig{number}-executed.md").exists() \
            else f"not yet produced: `ucudnn paper {number} --execute` on a GPU" if FIGURES[number].executes \
            else "none: a plan from measurements, as the paper's figure is"
        assert executed in index
    assert {n for n in FIGURES if not FIGURES[n].executes} == {"8", "14"}  # the paper's plans: a front, a division


@pytest.mark.slow
def test_every_page_sets_the_paper_beside_now_for_each_candidate_set(written):
    out, results, _ = written
    header = "| figure | what | paper (P100-SXM2) | " + " | ".join(f"now: {c}" for c in CANDIDATES.values()) + " |"
    for number, result in results.items():
        page = (out / f"fig{number}.md").read_text()
        assert header in page and "**Where they differ:**" in page, number
        assert result.headlines and result.notes, number
        for headline in result.headlines:
            assert headline.paper and len(headline.now) == len(CANDIDATES), (number, headline)
            assert f"| Fig. {number} | {headline.what} | {headline.paper} | " + " | ".join(headline.now) in page
    index = (out / "README.md").read_text()
    assert headline_table([(f"Fig. {n}", h) for n, r in results.items() for h in r.headlines]) in index


def _ratio(text: str) -> float:
    return float(re.match(r"([\d.]+)x", text).group(1))


@pytest.mark.slow
def test_the_headline_ratios_are_the_papers_beside_todays(written):
    """The issue's two: AlexNet's convolutions at 64 MiB (1.63x) and WD with `all` at 120 MiB (1.38x)."""
    _, results, _ = written
    alexnet = results["10"].headlines[0]
    assert alexnet.paper.startswith("1.63x") and all(_ratio(now) > 1 for now in alexnet.now)
    wd = results["13"].headlines[0]
    assert wd.paper == "1.38x" and all(_ratio(now) > 1 for now in wd.now)


@pytest.mark.slow
def test_what_the_recording_lacks_is_marked_with_the_command_that_measures_it(written):
    """DenseNet-40's `all` sizes are not in the shipped file: marked, and `ucudnn bench` named."""
    out, results, _ = written
    assert "ucudnn bench --net densenet40 --batch 256 --policy all" in results["11"].missing
    page = (out / "fig11.md").read_text()
    assert NOT_RECORDED in page and "`ucudnn bench --net densenet40 --batch 256 --policy all`" in page


@pytest.mark.slow
def test_torch_workspace_needs_the_gpu_in_the_predicted_figure(written):
    out, _, _ = written
    page = (out / "fig12.md").read_text()
    assert "needs the GPU" in page and "`ucudnn paper 12 --execute`" in page


@pytest.mark.slow
def test_every_drawing_keeps_its_titles_and_legends_inside(written):
    _, results, _ = written
    for number, result in results.items():
        figure = result.draw(None)
        renderer = FigureCanvasAgg(figure).get_renderer()
        figure.draw(renderer)
        for ax in figure.axes:
            for artist in [ax.title, *([ax.get_legend()] if ax.get_legend() else [])]:
                assert _inside(artist.get_window_extent(renderer), figure.bbox), (number, ax.get_title())


def _masked(text: str) -> str:
    return VOLATILE.sub("N ms (CBC", text)


@pytest.mark.slow
def test_docs_paper_is_what_the_command_writes_now(written):
    """docs/paper's pages are `ucudnn paper all --out docs/paper` of this checkout (solver seconds aside)."""
    out, _, _ = written
    for page in sorted(out.glob("*.md")):
        assert (DOCS / page.name).exists(), f"docs/paper/{page.name} is missing: run `ucudnn paper all`"
        assert _masked((DOCS / page.name).read_text()) == _masked(page.read_text()), (
            f"docs/paper/{page.name} is stale: run `ucudnn paper all --out docs/paper`")
    for png in out.glob("*.png"):
        assert (DOCS / png.name).exists(), f"docs/paper/{png.name} is missing: run `ucudnn paper all`"


def test_readme_links_the_paper_index():
    documentation = (REPO / "README.md").read_text().split("## Documentation")[1].split("\n## ")[0]
    assert "[docs/paper/README.md](docs/paper/README.md)" in documentation


@shipped
def test_the_command_writes_one_figure_and_prints_its_headlines(capsys, tmp_path):
    assert main(["paper", "9", "--out", str(tmp_path / "made")]) == 0
    out = capsys.readouterr().out
    assert "2.33x" in out and "Fig. 9" in out and "predicted from measurements recorded on" in out
    assert sorted(p.name for p in (tmp_path / "made").iterdir()) == ["fig9.md", "fig9.png"]


@pytest.mark.parametrize("out", ["q.db", "q.db/figures"])
def test_an_out_folder_where_a_file_stands_is_one_line_naming_it(capsys, tmp_path, out):
    """`paper 10 --out q.db` on an existing file said "[Errno 17] File exists: 'q.db'"."""
    (tmp_path / "q.db").write_text("a file")
    try:
        status = main(["paper", "10", "--out", str(tmp_path / out)])
    except SystemExit as exit_:  # argparse
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Errno" not in err
    assert f"{tmp_path / 'q.db'} is a file, not a folder; name a folder" in err, err
    assert (tmp_path / "q.db").read_text() == "a file"


def test_executing_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("ucudnn.paper.evidence.gpu_available", lambda: False)
    assert main(["paper", "9", "--execute", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--execute" in err and "GPU" in err
    assert list(tmp_path.iterdir()) == []


class _Timer:
    """ConfigurationTimer's stand-in: a configuration runs 10% over its measured sum."""

    def __init__(self):
        self.runs = []

    def time_ms(self, problem, configuration) -> float:
        self.runs.append((problem.key, configuration))
        return 1.1 * configuration.time_ms


def _executed(tmp_path, timer, figure: str, progress=None):
    settings = Settings(cache_path=str(tmp_path / "measured.db"))
    with Executed(settings, FakeBenchmarker(backends=("legacy", "engines")), timer, progress) as evidence:
        assert evidence.base.search == "full"  # measured as the paper's WR benchmarks: every candidate, every size
        return write_figures([figure], evidence, tmp_path / "out")


def test_an_executed_figure_measures_and_runs_every_configuration_it_shows(tmp_path):
    timer = _Timer()
    results, paths = _executed(tmp_path, timer, "9")
    assert [p.name for p in paths] == ["fig9-executed.md", "fig9-executed.png"]  # no index: it is the predicted one's
    page = paths[0].read_text()
    assert "ms (executed)" in page and "executed on Fake GPU" in page and "`ucudnn paper 9 --execute`" in page
    assert len(set(timer.runs)) == len(timer.runs)  # each configuration run once, every one the table shows
    assert {row[2] for row in results["9"].tables[0].rows} <= {c.describe() for _, c in timer.runs}
    runs = {f"{1.1 * c.time_ms:.3f}" for _, c in timer.runs}  # the table's times are the runs', not the sums
    assert {row[4] for row in results["9"].tables[0].rows} <= runs
    assert (tmp_path / "measured.db").exists()


def test_executing_without_measuring_plans_from_the_database_and_names_what_it_lacks(tmp_path):
    """--no-measure: a database `ucudnn bench` filled (here: one executed figure's) is used as it
    is; nothing is measured, every plan it holds is executed, and a plan it lacks is named."""
    _executed(tmp_path, _Timer(), "9")
    settings, timer, bench = Settings(cache_path=str(tmp_path / "measured.db")), _Timer(), FakeBenchmarker(
        backends=("legacy", "engines"))
    with Executed(settings, bench, timer, measure_missing=False) as evidence:
        results, paths = write_figures(["9", "10"], evidence, tmp_path / "again")
    assert bench.calls == 0 and timer.runs
    assert {row[2] for row in results["9"].tables[0].rows} <= {c.describe() for _, c in timer.runs}
    assert "ucudnn bench --net alexnet --batch 256" in paths[2].read_text()  # fig10-executed.md: what it lacks
    assert "`ucudnn paper 9 --execute --no-measure` writes" in paths[0].read_text()
    assert "none taken here" in paths[0].read_text()


def test_no_measure_belongs_to_execute(capsys, tmp_path):
    assert main(["paper", "9", "--no-measure", "--out", str(tmp_path)]) == 2
    assert "--execute" in capsys.readouterr().err


@pytest.mark.parametrize("figure", ["1", "14"])
@pytest.mark.slow
def test_the_executed_path_of_one_kernel_and_of_wd_runs_on_a_stand_in_gpu(tmp_path, figure):
    timer = _Timer()
    _, paths = _executed(tmp_path, timer, figure)
    assert [p.name for p in paths] == [f"fig{figure}-executed.md", f"fig{figure}-executed.png"]
    assert timer.runs and "executed on Fake GPU" in paths[0].read_text()


def test_an_executed_figure_says_which_kernel_it_measures_and_how_far_it_is(tmp_path):
    """Measuring a figure on a GPU the recording lacks takes minutes (Fig. 8 on an H200: over
    nine, docs/results.md): each kernel's measuring is reported as it starts, and the end."""
    heard = []
    _executed(tmp_path, _Timer(), "9", lambda done, total, problem: heard.append((done, total, problem.key)))
    assert heard and heard[0][0] == 0 and heard[-1][0] == heard[-1][1] > 0


@shipped
def test_the_index_links_an_executed_page_once_there_is_one(tmp_path):
    (tmp_path / "fig9-executed.md").write_text("executed\n")
    with Predicted(Settings()) as evidence:
        index = index_page({}, evidence, tmp_path)
    assert "[fig9-executed.md](fig9-executed.md)" in index
    assert "not yet produced: `ucudnn paper 1 --execute` on a GPU" in index
