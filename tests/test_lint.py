"""The lint gate: ruff over the package, the tests and the benchmarks with the rules pyproject.toml
selects (pyflakes' F: undefined names, unused imports, repeated keys, ...; import order, I;
pyupgrade, UP); and the type check, mypy over the package as pyproject.toml configures it. ruff
and mypy are pinned in the `test` extra."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_no_lint_errors():
    try:
        import ruff  # noqa: F401
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.fail("ruff is not installed: pip install -e '.[test]' (the lint gate must run wherever the tests do)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache",
                             "ucudnn", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lint_gate_has_its_rules_and_knows_the_test_helpers():
    """Undefined names fail the gate (F) beside import order (I) and pyupgrade (UP); every helper
    module of tests/ sorts as the tests' own (isort's known-local-folder, test_* by pattern)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ruff = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert ruff["select"] == ["F", "I", "UP"]
    helpers = {p.stem for p in (REPO / "tests").glob("*.py") if not p.stem.startswith("test_")}
    assert helpers <= set(ruff["isort"]["known-local-folder"]), helpers - set(ruff["isort"]["known-local-folder"])


@pytest.mark.slow  # mypy reads torch's and numpy's annotations: about 15 s
def test_no_type_errors(tmp_path):
    """`mypy ucudnn`: none at mypy's defaults, and the public faces (ucudnn, ucudnn.torch,
    ucudnn.handle, ucudnn.cudnn) strict ([tool.mypy]). The cache is the test's own."""
    pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]' installs it")
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "ucudnn"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
