"""The module path a first reader follows through a ucudnn command: each ucudnn function taken
the first time it is called (sys.setprofile, after every module is imported, so module bodies
do not count), its module in call order, consecutive repeats collapsed. Reports the modules
entered, the module changes and the re-entries (a module entered again after the path left it).
The architecture issue's bar: fewer modules and re-entries than before its redesign, for
`ucudnn optimize` (docs/results.md, "The planning path"). CPU only; run in a checkout:

    PYTHONPATH=. python3 bench/module_path.py optimize --net alexnet --batch 256 --workspace 64MiB
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import sys


def import_all() -> None:
    """Every ucudnn module but the torch integration's, so that calls, not imports, are traced."""
    import ucudnn

    for info in pkgutil.walk_packages(ucudnn.__path__, "ucudnn."):
        if "torch" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def first_call_path(run) -> tuple[list[str], int]:
    """The collapsed module path of the functions `run()` calls for the first time, and how many
    functions that is."""
    seen, path = set(), []

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("ucudnn") or frame.f_code in seen:
            return
        seen.add(frame.f_code)
        if not path or path[-1] != module:
            path.append(module)

    sys.setprofile(profile)
    try:
        run()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return path, len(seen)


def summary(path: list[str], functions: int) -> dict:
    entered, reentries = set(), 0
    for module in path:
        reentries += module in entered
        entered.add(module)
    return {"functions": functions, "modules": len(entered), "changes": max(len(path) - 1, 0),
            "reentries": reentries, "path": [m.removeprefix("ucudnn.") for m in path]}


def main(argv: list[str]) -> None:
    import_all()
    from ucudnn.cli import main as cli

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the command's own output
        result = summary(*first_call_path(lambda: cli(argv)))
    print(json.dumps({k: v for k, v in result.items() if k != "path"}))
    print(" -> ".join(result["path"]))


if __name__ == "__main__":
    main(sys.argv[1:])
