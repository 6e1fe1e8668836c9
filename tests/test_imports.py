"""The package's layering: no import circle among ucudnn's modules, counting imports inside
functions too (a lazy import still ties two modules' designs together)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ucudnn"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> set[str]:
    """The ucudnn modules `path` imports anywhere in it (`from .x import y` names module x.y
    where that is a module, else x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                      for alias in node.names}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_resolve_to_modules():
    graph = import_graph()
    assert "ucudnn.execute.bindings.cudnn" in graph["ucudnn.handle"]  # from .bindings import cudnn
    assert "ucudnn.execute.bindings.library" in graph["ucudnn.execute.bindings.cudnn"]  # from . import library


def test_no_import_circle_in_the_package():
    """Package __init__ files re-export their modules, so an import of the package itself (`from
    ucudnn import X` inside ucudnn) would close a circle through them: modules import modules."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def unit(module: str) -> str:
    """The top-level unit a module belongs to: `ucudnn.measure.cache.database` -> `ucudnn.measure.cache`."""
    return ".".join(module.split(".")[:2])


def test_no_import_circle_among_the_top_level_units():
    """A subpackage counts as one unit (its modules together): no circle among units, within a
    layer or among the faces, so that each package reads as one concept."""
    units: dict[str, set[str]] = {}
    for module, imports in import_graph().items():
        units.setdefault(unit(module), set()).update(unit(m) for m in imports if unit(m) != unit(module))
    cycle = find_cycle(units)
    assert cycle is None, "import circle among units: " + " -> ".join(cycle)


# The layers, lowest first (docs/architecture.md): a module imports modules of its own layer and
# of the layers before it, never of a later one. The faces (the top-level modules and packages not
# named here: handle, cudnn, torch, integrations, cli, paper) come last.
LAYERS = ("core", "optimizers", "execute", "measure", "plan", "reports")


def layer(module: str) -> int:
    """The index of `module`'s layer in LAYERS; len(LAYERS) for the faces."""
    part = module.split(".")[1] if module.count(".") else ""
    return LAYERS.index(part) if part in LAYERS else len(LAYERS)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of `graph` from a module into a later layer, as 'a -> b'."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_layer_reads_a_module_by_its_package():
    assert layer("ucudnn.core.nets.layers") == 0
    assert layer("ucudnn.plan.planner") == LAYERS.index("plan")
    assert layer("ucudnn.handle") == layer("ucudnn.integrations.torch.layers") == len(LAYERS)
    assert upward_imports({"ucudnn.core.problem": {"ucudnn.plan.config"}}) == ["ucudnn.core.problem -> ucudnn.plan.config"]


def test_no_layer_imports_a_later_one():
    """Imports inside functions and under TYPE_CHECKING count: either ties two layers' designs."""
    assert upward_imports(import_graph()) == []


def test_every_layer_is_a_package_with_its_rule():
    """Each layer's __init__ says what it may import, as docs/architecture.md does."""
    for name in LAYERS:
        doc = (PACKAGE / name / "__init__.py").read_text(encoding="utf-8")
        assert "May import:" in doc, name


@dataclass(frozen=True)
class Walk:
    """What running `ucudnn` did until plan.sources.tables_for returned, each function's first
    call only (later calls of a function repeat a way already walked): `up`, each call from a
    ucudnn module into one that imports it, transitively (a call back up the import graph: a
    callback); `files`, the modules whose functions were called; `below`, those called between
    tables_for's call and its return; `bodies`, the modules whose bodies ran on the way (a lazy
    import of a module not imported yet); `lazy`, the functions called that hold an import of a
    ucudnn module (run whether or not it was imported yet); `stays`, the modules control was in,
    in order, once per stay (a call enters the callee's module, a return goes back to the
    caller's)."""

    up: list[str]
    files: set[str]
    below: set[str]
    bodies: set[str]
    lazy: set[str]
    stays: list[str]

    @property
    def reentries(self) -> int:
        """How many times control came back into a module it had left."""
        return len(self.stays) - len(set(self.stays))


def walk_to_the_tables(argv: list[str]) -> Walk:
    """`ucudnn` run with `argv` until plan.sources.tables_for returns: its arguments followed to
    the tables (`Walk`)."""
    import contextlib
    import dis
    import io
    import sys

    import ucudnn.plan.sources as sources
    from ucudnn.cli import main

    graph = import_graph()

    def below(module: str, seen: set[str]) -> set[str]:
        for target in graph.get(module, ()):
            if target not in seen:
                seen.add(target)
                below(target, seen)
        return seen
    imported = {module: below(module, set()) for module in graph}
    up: list[str] = []
    files: set[str] = set()
    inside: set[str] = set()
    bodies: set[str] = set()
    lazy: set[str] = set()
    stays: list[str] = []
    seen: set = set()
    entered: set = set()
    state = {"inside": False, "done": False}

    def ours(frame) -> str:
        """The module of the nearest ucudnn frame from `frame` outwards ('' if none)."""
        while frame is not None and not frame.f_globals.get("__name__", "").startswith("ucudnn"):
            frame = frame.f_back
        return frame.f_globals["__name__"] if frame is not None else ""

    def imports_ours(code) -> bool:
        """Whether `code` holds an import of a ucudnn module (relative: its level, pushed two
        instructions before IMPORT_NAME, is above 0)."""
        found = list(dis.get_instructions(code))
        return any(i.opname == "IMPORT_NAME" and (found[k - 2].argval or i.argval.startswith("ucudnn"))
                   for k, i in enumerate(found))

    def stay(module: str) -> None:
        if module and (not stays or stays[-1] != module):
            stays.append(module)

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if state["done"] or not module.startswith("ucudnn") or event not in ("call", "return"):
            return
        code = frame.f_code
        if event == "return":
            if code is sources.tables_for.__code__:
                state["done"] = True
            if frame in entered:
                entered.discard(frame)
                stay(ours(frame.f_back))
            return
        if code is sources.tables_for.__code__:
            state["inside"] = True
        if code in seen:
            return
        seen.add(code)
        entered.add(frame)
        stay(module)
        if code.co_name == "<module>":
            bodies.add(module)
            return
        files.add(module)
        if state["inside"]:
            inside.add(module)
        name = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        if imports_ours(code):
            lazy.add(name)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller in imported.get(module, ()):
            up.append(f"{caller} -> {module}.{code.co_name}")

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(argv)
    finally:
        sys.setprofile(None)
    return Walk(up, files, inside, bodies, lazy, stays)


OPTIMIZE = ["optimize", "--net", "alexnet", "--batch", "256", "--workspace", "64MiB"]


def test_walk_counts_a_module_left_and_entered_again():
    walk = Walk([], set(), set(), set(), set(), ["a", "b", "a", "c", "b"])
    assert walk.reentries == 2


def test_optimize_s_arguments_reach_the_tables_going_down():
    """One place decides where measurements come from (plan.sources) and the rest receives what it
    opened: lower layers call back up only through what they are handed (docs/architecture.md).
    Offline, the tables are read from the recording without the benchmark: measurements, rows,
    plans, one way. The files before tables_for are the command's own (arguments, settings and
    the variables they read, the network, the request a report names); those below it are plan.sources, the database and its
    connection, schema, rules and paths, the problem model (problem, device, measurements,
    accuracy, accumulation), the settings and the search."""
    from ucudnn.measure.cache import recorded_path

    if recorded_path() is None:
        pytest.skip("no recorded measurements are shipped in cache/ yet")
    walk = walk_to_the_tables(OPTIMIZE)
    assert len(walk.up) <= 2, walk.up
    assert not [call for call in walk.up if ".measure." in call.split(" -> ")[0]
                and ".plan." in call.split(" -> ")[1]], walk.up  # measure calls nothing of plan
    assert "ucudnn.measure.benchmark" not in walk.files
    assert "ucudnn.plan.sources" in walk.below and len(walk.below) <= 13, sorted(walk.below)
    assert len(walk.files) <= 26, sorted(walk.files)
    assert walk.reentries <= 99, walk.stays
    assert not walk.bodies, walk.bodies  # every module it runs is imported before main runs
