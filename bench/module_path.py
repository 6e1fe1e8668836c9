"""The module path a first reader follows through a ucudnn command: each ucudnn function taken
the first time it is called (sys.setprofile, after every module is imported, so module bodies
do not count), its module in call order, consecutive repeats collapsed. Reports the modules
entered, the module changes and the re-entries (a module entered again after the path left it).
The architecture issue's bar: fewer modules and re-entries than before its redesign, for
`ucudnn optimize`, and for a converted model's first training step (docs/results.md, "The
planning path"). CPU only; run in a checkout:

    PYTHONPATH=. python3 bench/module_path.py optimize --net alexnet --batch 256 --workspace 64MiB
    PYTHONPATH=. python3 bench/module_path.py convert

`convert` plans AlexNet's five convolutions (B = 8, 64 MiB, planning="first_call") in their first
training step on the CPU, through the test doubles of the GPU side (tests/torch_doubles.py: real
Context, Assignments, solve and dispatch; a synthetic benchmarker and NumPy kernels).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import pkgutil
import sys


def import_all(torch_integration: bool = False) -> None:
    """Every ucudnn module (the torch integration's where asked), so that calls, not imports,
    are traced."""
    import ucudnn

    for info in pkgutil.walk_packages(ucudnn.__path__, "ucudnn."):
        if (torch_integration or "torch" not in info.name) and not info.name.endswith("__main__"):
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


def converted_step():
    """A run of AlexNet's convolutions converted, planned in their first training step (the CPU
    doubles of the GPU side, a database of its own)."""
    import tempfile
    from pathlib import Path

    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from torch_doubles import NumpyFramework

    import ucudnn.torch as ut
    from ucudnn.measure.cache import Cache

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Conv2d(64, 192, 5, padding=2),
                          nn.ReLU(), nn.MaxPool2d(3, 2), nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1))
    x = torch.randn(8, 3, 127, 127)
    folder = tempfile.mkdtemp()
    context = ut.Context(framework=NumpyFramework(), cache=Cache(Path(folder) / "path.db"), workspace_limit="64MiB",
                         planning="first_call")

    def step():
        ut.convert(model, context=context)
        model(x).sum().backward()
    return step


def main(argv: list[str]) -> None:
    converting = argv[:1] == ["convert"]
    import_all(torch_integration=converting)
    if converting:
        run = converted_step()
    else:
        from ucudnn.cli import main as cli

        def run():
            cli(argv)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the command's own output
        result = summary(*first_call_path(run))
    print(json.dumps({k: v for k, v in result.items() if k != "path"}))
    print(" -> ".join(result["path"]))


if __name__ == "__main__":
    main(sys.argv[1:])
