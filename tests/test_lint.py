"""The lint gate: ruff over the package, the tests and the benchmarks with the rules pyproject.toml
selects (pyflakes' F: undefined names, unused imports, repeated keys, ...; import order, I;
pyupgrade, UP); and the type check, mypy over the package as pyproject.toml configures it. ruff
and mypy are pinned in the `test` extra. Also the package's prose: its comments and docstrings
state the rule and cite docs/results.md by a section's name, never history (stops, issues,
sessions, what a figure went from); the figures are left to docs/results.md (not checked)."""
from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
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


PACKAGE = REPO / "ucudnn"
RESULTS = ("docs/results.md", "docs/results-archive.md")
# Prose that narrates how the code got here rather than the rule it keeps, each with what it catches
_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th))"
HISTORY = {
    r"\bstops? #?\d+": "Stop 45",
    r"\b(?:stop|call)\d+\b": "stop26/call1",
    r"\bissues? #?\d+": "issue 14",
    r"\bsessions? #?\d+": "session 6",
    rf"\b{_ORDINAL} session\b": "the sixth session",
    r"\bwent from\b": "went from 57-69 to 47-50 ms",
    r"\bturns? ago\b": "a turn ago",
    r"\bpreviously\b": "previously",
    r"\b(?:this|last|previous|next) (?:stop|turn|session)\b": "the last stop",
}
# docs/results.md, "Section" or docs/results.md ("Section"), the name a heading's whole or a part
CITATION = re.compile(r'(docs/results(?:-archive)?\.md)[,;:\s(]*"([^"]+)"')
BARE_CITATION = re.compile(r'docs/results(?:-archive)?\.md(?![,;:\s(]*")')


def prose(path: Path) -> list[tuple[int, str]]:
    """The comments (a run of them on consecutive lines as one) and docstrings of `path`, each with
    its first line, whitespace collapsed so that a phrase or citation wrapped over lines reads whole."""
    source = path.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    run: list[str] = []
    first = last = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        if run and token.start[0] != last + 1:
            found.append((first, " ".join(run)))
            run = []
        if not run:
            first = token.start[0]
        run.append(token.string.lstrip("#").strip())
        last = token.start[0]
    if run:
        found.append((first, " ".join(run)))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                found.append((node.body[0].lineno, docstring))
    return [(line, " ".join(text.split())) for line, text in sorted(found)]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_prose_checks_catch_what_they_are_for():
    """Each pattern catches its example, and the citation forms are told apart."""
    for pattern, example in HISTORY.items():
        assert re.search(pattern, example, re.IGNORECASE), (pattern, example)
    assert CITATION.search('(docs/results.md, "Forty steps")') and CITATION.search('docs/results.md ("Cold start")')
    assert BARE_CITATION.search("docs/results.md)") and not BARE_CITATION.search('docs/results.md, "Cold start"')


def test_no_history_in_comments_or_docstrings():
    """Comments and docstrings state the rule (and cite docs/results.md's section holding the
    evidence); how the code got there belongs to git log and docs/results.md."""
    found = [f"{path.relative_to(REPO)}:{line}: {match.group(0)!r} in {text[:160]!r}"
             for path in _modules()
             for line, text in prose(path)
             for pattern in HISTORY for match in re.finditer(pattern, text, re.IGNORECASE)]
    assert not found, "\n".join(found)


def test_every_results_citation_names_a_section():
    """A citation of docs/results.md or docs/results-archive.md names a section, and the name is
    (part of) a heading of the file it names: a heading renamed or moved to the archive breaks it."""
    headings = {doc: [" ".join(line.lstrip("#").split()) for line in (REPO / doc).read_text(encoding="utf-8")
                      .splitlines() if re.match(r"#{1,6} ", line)] for doc in RESULTS}
    unknown, bare = [], []
    for path in _modules():
        for line, text in prose(path):
            where = f"{path.relative_to(REPO)}:{line}"
            unknown += [f"{where}: {doc}, {name!r}" for doc, name in CITATION.findall(text)
                        if not any(name in heading for heading in headings[doc])]
            bare += [f"{where}: {text[max(0, m.start() - 60):m.end() + 20]!r}"
                     for m in BARE_CITATION.finditer(text)]
    assert not unknown, "no such heading:\n" + "\n".join(unknown)
    assert not bare, "a citation without its section's name:\n" + "\n".join(bare)
