"""README.md's commands stay true: CI runs the README's test command and then its slow tests, and
the main job's command is the CLI call that tests/test_cli.py runs on the shipped measurements."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    """The indented shell commands of README.md's 'On a fresh machine' section."""
    section = (ROOT / "README.md").read_text().split("## On a fresh machine")[1].split("\n## ")[0]
    return [line.strip() for line in section.splitlines() if line.startswith(("    python3 -m venv", "    .venv/"))]


def test_readme_gives_an_install_and_run_command_a_test_command_and_the_slow_tests_one():
    main_job, tests, slow = _commands()
    assert "ucudnn optimize --net alexnet --batch 256 --workspace 64MiB" in main_job
    assert "pytest" in tests and slow == tests.rpartition(" && ")[2] + " -m slow"


def test_readme_says_which_alexnet_its_headline_and_its_command_are():
    text = (ROOT / "README.md").read_text()
    headline = text.split("## On a fresh machine")[0]
    section = text.split("## On a fresh machine")[1].split("\n## ")[0]
    assert "torchvision's AlexNet" in headline
    assert "Caffe" in section and "--net torchvision:alexnet" in section


def test_every_number_of_the_readme_headline_is_a_figure_of_results_md():
    """README's headline numbers (ratios and milliseconds) are docs/results.md's: one home per figure."""
    import re

    headline = (ROOT / "README.md").read_text().split("## On a fresh machine")[0]
    results = (ROOT / "docs" / "results.md").read_text()
    numbers = re.findall(r"(\d+\.\d+)(?:x| ms)", headline)
    assert len(numbers) >= 10 and [n for n in numbers if n not in results] == []


def test_ci_runs_the_readme_test_command_and_then_the_slow_tests():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert ci == _commands()[1:]
    # the README's command runs every test but the slow ones, the second command those
    assert 'addopts = ["-m", "not slow"]' in (ROOT / "pyproject.toml").read_text()


def _layout_paths() -> set[str]:
    """Every ucudnn path README.md's layout table names (names after the first in a cell are
    beside the first one)."""
    section = (ROOT / "README.md").read_text().split("## Layout")[1].split("\n## ")[0]
    paths = set()
    for row in section.splitlines():
        cells = row.split("|")
        if len(cells) < 3 or "`ucudnn/" not in cells[1]:
            continue
        names = [name.strip().strip("`") for name in cells[1].split(",")]
        folder = names[0].rstrip("/").rpartition("/")[0]
        paths |= {names[0].rstrip("/")} | {f"{folder}/{name.rstrip('/')}" for name in names[1:]}
    return paths


def test_readme_layout_table_matches_the_tree():
    named = _layout_paths()
    package = ROOT / "ucudnn"
    tree = {f"ucudnn/{p.name}" for p in package.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    assert named == tree, f"in the table only: {sorted(named - tree)}; in the tree only: {sorted(tree - named)}"


def _variables_read() -> set[str]:
    """Every UCUDNN_* variable ucudnn reads: those Settings.load reads (ucudnn.plan.config.variables)
    and those the code names as string literals (UCUDNN_BENCH_DEVICES, ucudnn.torch's options, ...)."""
    import re

    from ucudnn.plan.config import variables

    settings = set(variables())
    named = {name for path in (ROOT / "ucudnn").rglob("*.py")
             for name in re.findall(r"""["'](UCUDNN_[A-Z_]+)["']""", path.read_text())}
    return settings | named


def test_readme_lists_every_variable_ucudnn_reads():
    """The list lacked UCUDNN_SEARCH and UCUDNN_CUDNN_LIBRARY (and four settings of ucudnn.torch)."""
    section = (ROOT / "README.md").read_text().split("Settings come from")[1].split("\n## ")[0]
    variables = _variables_read()
    assert {"UCUDNN_SEARCH", "UCUDNN_CUDNN_LIBRARY", "UCUDNN_CACHE", "UCUDNN_BENCH_DEVICES"} <= variables
    assert sorted(v for v in variables if f"`{v}`" not in section) == []
