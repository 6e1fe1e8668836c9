"""The docs say what the code does now: docs/cli.md's examples print what they show (re-run by
tests/docs_examples.py), and docs/results.md's counts are those of the shipped file."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sqlite3
import tempfile
from pathlib import Path

import pytest

from ucudnn.measure.cache import SCHEMA_VERSION, BenchmarkDatabase, recorded_path, recorded_paths

REPO = Path(__file__).resolve().parents[1]
REGENERATE = "python3 tests/docs_examples.py"


def _docs_examples():
    spec = importlib.util.spec_from_file_location("docs_examples", REPO / "tests" / "docs_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
@pytest.mark.slow
def test_every_example_of_cli_md_prints_what_the_page_shows():
    """Fails when a command of docs/cli.md prints other than the page shows (wall and solver
    seconds aside); the torchvision example depends on what is installed and is not compared."""
    examples = _docs_examples()
    page = examples.PAGE.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        folder, env = examples._scratch(Path(tmp))
        now = examples.render(page, folder, env, skip=lambda command: "torchvision" in command)
    assert examples.masked(now) == examples.masked(page), f"docs/cli.md is stale: run `{REGENERATE}`"


def test_the_examples_are_found_and_cat_blocks_are_inputs(tmp_path):
    examples = _docs_examples()
    page = "```console\n$ cat a.txt\nhello\n```\n\n```console\n$ cat a.txt; echo \"exit $?\"\nstale\n```\n"
    folder, env = examples._scratch(tmp_path)
    assert examples.render(page, folder, env) == page.replace("stale\n", "hello\nexit 0\n")


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/ yet")
def test_results_md_counts_the_shipped_measurements():
    text = (REPO / "docs" / "results.md").read_text()
    stated = re.search(r"The shipped file holds ([\d,]+) measurements for direct execution\s+and ([\d,]+) for "
                       r"graph execution", text)
    assert stated, "docs/results.md no longer states the shipped file's counts"
    with BenchmarkDatabase(recorded_path(), readonly=True) as database:
        counts = {d.execution: sum(n for _, n in database.kernels(d)) for d in database.devices()}
    assert [int(n.replace(",", "")) for n in stated.groups()] == [counts["direct"], counts["graph"]]


def test_cache_md_states_the_schema_version_of_the_code_and_the_shipped_files():
    stated = re.search(r"The schema version is the file's `PRAGMA user_version`: now (\d+)",
                       (REPO / "docs" / "cache.md").read_text())
    assert stated, "docs/cache.md no longer states the schema version"
    assert int(stated.group(1)) == SCHEMA_VERSION
    for path in recorded_paths():  # "the shipped recordings are such files"
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION, path


def test_cache_md_describes_every_column_of_a_measurement():
    from ucudnn.measure.cache.schema import MEASUREMENT_COLUMNS

    stored = (REPO / "docs" / "cache.md").read_text().split("## What is stored")[1].split("\n## ")[0]
    assert [c for c in MEASUREMENT_COLUMNS if f"`{c}`" not in stored] == []


def test_the_wd_md_example_prints_what_the_page_shows():
    page = (REPO / "docs" / "wd.md").read_text().split("### Example")[1]
    code, shown = re.search(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", page, re.S).groups()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/wd.md", "exec"), {})
    assert printed.getvalue() == shown


def test_cli_md_names_every_builtin_network_and_how_many_record_py_records():
    """The page listed five built-in networks where `ucudnn nets` lists eight."""
    from ucudnn.core.nets import list_networks

    names = [network.name for network in list_networks()]
    page = (REPO / "docs" / "cli.md").read_text()
    builtin = page.split("**A built-in network**")[1].split("**A network file**")[0]
    assert [name for name in names if f"`{name}`" not in builtin] == []
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"`DEFAULT_SPECS`: the {words[len(names)]} built-in networks" in page
    recorded = re.search(r"NETS = \((.*?)\)", (REPO / "bench" / "record.py").read_text(), re.S).group(1)
    assert [name for name in names if f'"{name}:' not in recorded] == []


def test_cli_md_describes_every_field_of_a_network_file():
    from dataclasses import fields

    from ucudnn.core.nets import ConvLayer

    section = (REPO / "docs" / "cli.md").read_text().split("**A network file**")[1].split("```")[0]
    assert [f.name for f in fields(ConvLayer) if f"`{f.name}`" not in section] == []
    assert "`[depth, height, width]`" in section and "`[length]`" in section


def _relative_links(page: Path) -> list[str]:
    """The targets of the page's Markdown links that name a path in the repository (no scheme,
    no bare anchor), without their anchor."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
    return [t.split("#")[0] for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]


def test_every_link_of_the_docs_names_a_path_that_exists():
    """Moving modules, retiring scripts and raw outputs must not leave a page pointing nowhere."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench").rglob("*.md"))]
    missing = [f"{page.relative_to(REPO)}: {target}" for page in pages for target in _relative_links(page)
               if target and not (page.parent / target).exists()]
    assert missing == []
