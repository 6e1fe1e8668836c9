"""What a packager reads: the license, the type marker and the version in the wheel, the range of
each dependency, the versions CI pins (.ci/constraints.txt), and the sdist's files."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import ucudnn

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
requirements = pytest.importorskip("packaging.requirements")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_license_file_is_the_one_pyproject_declares_and_ships():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "Copyright (c) 2026, the ucudnn authors" in text
    assert PROJECT["project"]["license"] == "BSD-3-Clause" and PROJECT["project"]["license-files"] == ["LICENSE"]


def test_the_package_says_it_is_typed():
    assert (REPO / "ucudnn" / "py.typed").is_file()
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["ucudnn"]


def test_the_version_is_written_in_one_place():
    """pyproject.toml read 0.1.0 beside ucudnn.__version__: now it reads ucudnn.__version__."""
    assert "version" not in PROJECT["project"] and "version" in PROJECT["project"]["dynamic"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ucudnn.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", ucudnn.__version__)
    assert f"## {ucudnn.__version__}" in (REPO / "CHANGELOG.md").read_text()


def _direct() -> list:
    """pyproject.toml's dependencies, its test extra, and the torch of README's test command."""
    project = PROJECT["project"]
    return [requirements.Requirement(text) for text in
            (*project["dependencies"], *project["optional-dependencies"]["test"], "torch>=2.1")]


def _pins() -> dict[str, str]:
    lines = (REPO / ".ci" / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {_name(name): version for name, version in pins}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_ci_pins_every_direct_dependency_within_pyprojects_range():
    """CI installed whatever resolved that day: a release elsewhere could turn it red, or leave it
    green while users break. Each direct dependency is pinned, inside the range users get."""
    pins = _pins()
    for requirement in _direct():
        assert _name(requirement.name) in pins, f"pin {requirement.name} in .ci/constraints.txt"
        assert requirement.specifier.contains(pins[_name(requirement.name)]), (requirement, pins[requirement.name])
    assert pins["torch"] == "2.13.0"  # README's command installs torch==2.13.0


def test_pulp_3_and_4_are_allowed_and_a_solver_comes_with_ucudnn():
    """PuLP < 4 held back every user with PuLP 4 for another tool; PuLP 4 bundles no CBC, so HiGHS
    (highspy) is a dependency: WD has a solver whatever PuLP brings (docs/wd.md, "The ILP solver")."""
    (pulp,) = [r for r in _direct() if _name(r.name) == "pulp"]
    assert pulp.specifier.contains("3.3.2") and pulp.specifier.contains("4.2.0")
    assert "highspy" in {_name(r.name) for r in _direct()} and "highs" not in PROJECT["project"]["optional-dependencies"]


def test_the_cuda12_extra_installs_no_cuda13_package():
    """nvidia-cudnn-frontend 1.29 and later require nvidia-cutlass-dsl[cu13] (its CUDA 13 libraries
    and cuda-bindings 13), which `[cuda12]` installed: it takes 1.28, the last release without."""
    extra = [requirements.Requirement(text) for text in PROJECT["project"]["optional-dependencies"]["cuda12"]]
    assert [r.name for r in extra if re.search(r"cu(da)?13", r.name)] == []
    (frontend,) = [r for r in extra if r.name == "nvidia-cudnn-frontend"]
    assert frontend.specifier.contains("1.28.0") and not frontend.specifier.contains("1.29.0")


# what the sdist holds beside the package, its data and the license (MANIFEST.in)
SDIST_FOLDERS = ("tests", "docs", "bench", ".ci")
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".whl", "out", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", ".ruff_cache")


def test_the_sdist_holds_the_tests_their_helpers_and_what_they_read(tmp_path):
    """The sdist's tests/ held test_*.py alone (setuptools' default), without conftest.py, fakes.py
    and the other helpers: pytest on an unpacked sdist failed at `import fakes`."""
    tree = shutil.copytree(REPO, tmp_path / "tree", ignore=NOT_SOURCES)
    subprocess.run([sys.executable, "-c", "from setuptools.build_meta import build_sdist; build_sdist('dist')"],
                   cwd=tree, check=True, capture_output=True)
    (sdist,) = (tree / "dist").glob("ucudnn-*.tar.gz")
    with tarfile.open(sdist) as archive:
        shipped = {name.partition("/")[2] for name in archive.getnames()}
    wanted = {path.relative_to(tree).as_posix() for folder in SDIST_FOLDERS
              for path in (tree / folder).rglob("*") if path.is_file()}
    assert {"tests/conftest.py", "tests/fakes.py", ".ci/run"} <= wanted
    assert sorted(wanted - shipped) == [] and "CHANGELOG.md" in shipped


def test_ci_and_readme_install_with_the_constraints():
    ci = (REPO / ".ci" / "run").read_text()
    assert "-c .ci/constraints.txt" in ci
    assert "-c .ci/constraints.txt" in (REPO / "README.md").read_text()
