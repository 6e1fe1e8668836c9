"""Re-run every example command of docs/cli.md and rewrite its output in place, so the page shows
what this checkout prints (run it after re-recording the shipped database):

    python3 tests/docs_examples.py          # rewrite docs/cli.md (and the plots under docs/img/)
    python3 tests/docs_examples.py --check  # exit 1, with a diff, where the page differs

An example is a ```console block whose first line is `$ COMMAND`; the rest of the block is the
output. `$ cat FILE` blocks are inputs: their text becomes FILE for the commands after them.
Commands run in bash in a scratch folder with `ucudnn` on PATH (this checkout's), no UCUDNN_*
variables but UCUDNN_PROGRESS=0 (the progress line of a command that takes seconds depends on the
machine's speed) and no visible GPU, so they print what a CPU-only machine does from the shipped file.
tests/test_docs.py runs the check.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cli.md"
SHOWN_ROOT = "~/ucudnn"  # printed paths of this checkout appear as those of a clone there
_BLOCK = re.compile(r"^```console\n\$ (?P<command>[^\n]*)\n(?P<output>.*?)^```$", re.M | re.S)
# What changes from run to run (wall and solver seconds), masked when pages are compared.
_VOLATILE = [(re.compile(r"\d+(\.\d+)? s\b"), "N s"),
             (re.compile(r'"(build|solve)_seconds": [\d.e+-]+'), r'"\1_seconds": N')]


def _environment(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCUDNN_")} | {"UCUDNN_PROGRESS": "0"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", CUDA_VISIBLE_DEVICES="", COLUMNS="100",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return env


def _scratch(folder: Path) -> tuple[Path, dict[str, str]]:
    """A `ucudnn` command of this checkout in `folder`/bin, and the folder's docs/img for plots."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ucudnn"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ucudnn "$@"\n')
    shim.chmod(0o755)
    (folder / "docs" / "img").mkdir(parents=True)
    return folder, _environment(bin_dir)


def _run(command: str, folder: Path, env: dict[str, str]) -> str:
    result = subprocess.run(["bash", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=300)  # one stream, in order
    output = result.stdout.replace(str(REPO), SHOWN_ROOT)
    return output if output.endswith("\n") else output + "\n"  # `head -c` cuts lines


def render(page: str, folder: Path, env: dict[str, str], skip=lambda command: False) -> str:
    """`page` with the output of every example replaced by what its command prints now (those
    `skip` names keep theirs)."""
    def example(match: re.Match) -> str:
        command, output = match.group("command"), match.group("output")
        source = re.fullmatch(r"cat (\S+)", command)
        if source:
            (folder / source.group(1)).write_text(output)
        elif not skip(command):
            output = _run(command, folder, env)
        return f"```console\n$ {command}\n{output}```"

    return _BLOCK.sub(example, page)


def masked(page: str) -> str:
    for pattern, replacement in _VOLATILE:
        page = pattern.sub(replacement, page)
    return page


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare only: exit 1 where docs/cli.md differs")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        folder, env = _scratch(Path(tmp))
        new = render(page, folder, env)
        if args.check:
            diff = list(difflib.unified_diff(masked(page).splitlines(), masked(new).splitlines(), lineterm=""))
            print("\n".join(diff) or f"{PAGE} is up to date")
            return 1 if diff else 0
        PAGE.write_text(new)
        for plot in (folder / "docs" / "img").iterdir():
            shutil.copy(plot, REPO / "docs" / "img" / plot.name)
    print(f"rewrote {PAGE} and its plots")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
