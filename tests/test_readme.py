"""README.md's two commands stay true: CI runs the README's test command, and the main job's
command is the CLI call that tests/test_cli.py runs on the shipped measurements."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    """The indented shell commands of README.md's 'On a fresh machine' section."""
    section = (ROOT / "README.md").read_text().split("## On a fresh machine")[1].split("\n## ")[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    python3 -m venv")]


def test_readme_gives_an_install_and_run_command_and_a_test_command():
    main_job, tests = _commands()
    assert "ucudnn optimize --net alexnet --batch 256 --workspace 64MiB" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in ci
