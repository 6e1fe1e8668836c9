"""The lint gate: pyflakes' rules (ruff's F: undefined names, unused imports, repeated keys, ...)
over the package, the tests and the benchmarks; and the type check, mypy over the package as
pyproject.toml configures it. ruff and mypy are pinned in the `test` extra."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_no_pyflakes_errors():
    try:
        import ruff  # noqa: F401
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.fail("ruff is not installed: pip install -e '.[test]' (the lint gate must run wherever the tests do)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--output-format", "concise",
                             "--no-cache", "ucudnn", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # mypy reads torch's and numpy's annotations: about 15 s
def test_no_type_errors(tmp_path):
    """`mypy ucudnn`: none at mypy's defaults, and the public faces (ucudnn, ucudnn.torch,
    ucudnn.handle, ucudnn.cudnn) strict ([tool.mypy]). The cache is the test's own."""
    pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]' installs it")
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "ucudnn"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
