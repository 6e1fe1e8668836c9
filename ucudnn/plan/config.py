"""Settings: keyword arguments first, then UCUDNN_* environment variables, then defaults; and the
rules that read them together (Settings.load): a total limit means WD (_one_meaning), and with a
memory timeline (ucudnn.torch) limits from it (_from_timeline)."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

from ..core.device import EXECUTIONS
from ..core.errors import ConfigError, unknown
from ..core.problem import INT64_MAX, ConvProblem
from ..execute.backends import CHOICES as BACKEND_CHOICES
from ..measure.variables import CACHE_VARIABLE, refuse_misnamed
from ..optimizers import DIVIDING, OPTIMIZERS as REGISTRY, PER_KERNEL, Optimizer
from ..optimizers.search import SEARCHES, Search, named
from ..optimizers.solvers import FIRST_INSTALLED, SOLVERS
from .memory import AUTO

POLICIES = ("all", "powerOfTwo", "undivided")
OPTIMIZERS = tuple(REGISTRY)
# When the Planner plans a framework's layer: on its first call, which waits for it; or between
# iterations, the layer running the framework's own convolution until its plan is ready (ucudnn.plan.planner)
PLANNINGS = ("first_call", "between_iterations")

# The workspace limits and their variables; either may be AUTO, limits from the memory timeline of a
# training step (ucudnn.plan.memory), which only planning with one (ucudnn.torch) has: Settings.load
LIMITS = ("workspace_limit", "total_limit")
LIMIT_VARIABLES = tuple(f"UCUDNN_{name.upper()}" for name in LIMITS)

_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kb": 10**3, "kib": 2**10,
    "m": 2**20, "mb": 10**6, "mib": 2**20,
    "g": 2**30, "gb": 10**9, "gib": 2**30,
    "t": 2**40, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
SIZE_FORMS = 'a byte count ("67108864") or a number with a unit ("64MiB", "1.5GiB", "512KiB", "1GB")'


def parse_size(value: str | int, name: str = "size") -> int:
    """Bytes from an int or a string such as "64MiB", "1.5GiB", "1048576"."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size; use {SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} is negative; use {SIZE_FORMS}")
        return _int64(value, value, name)
    if str(value).strip().startswith("-"):
        raise ConfigError(f"{name}={value!r} is negative; sizes are >= 0: use {SIZE_FORMS}")
    match = _SIZE.match(str(value))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS:
        raise ConfigError(f"{name}={value!r} is not a size; use {SIZE_FORMS}")
    size = Fraction(Decimal(match.group(1))) * _UNITS[unit]  # exact: no float rounding above 2**53
    if size.denominator != 1:
        raise ConfigError(f"{name}={value!r} is not a whole number of bytes; use {SIZE_FORMS}")
    return _int64(int(size), value, name)


def _int64(size: int, value, name: str) -> int:
    if size > INT64_MAX:
        raise ConfigError(f"{name}={value!r} is more than int64 holds ({INT64_MAX} bytes); use a smaller size")
    return size


def timeline_limits(env: Mapping[str, str]) -> list[str]:
    """The limit variables of `env` set to AUTO, which Settings.load reads as unset: without a
    memory timeline the defaults hold, with one (ucudnn.torch) limits from it are the default."""
    return [v for v in LIMIT_VARIABLES if _is_auto(env.get(v))]


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def format_size(nbytes: int) -> str:
    """A short human form: 67108864 -> '64.0 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def batch_sizes(policy: str, batch: int) -> tuple[int, ...]:
    """The micro-batch sizes S a policy benchmarks for a mini-batch of `batch`, ascending."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch={batch!r} must be a positive integer")
    if policy == "all":
        return tuple(range(1, batch + 1))
    if policy == "powerOfTwo":
        powers = {1 << i for i in range(batch.bit_length()) if 1 << i <= batch}
        return tuple(sorted(powers | {batch}))
    if policy == "undivided":
        return (batch,)
    raise unknown(policy, POLICIES, "policy")


def choice(value: str, choices: tuple[str, ...], name: str = "") -> str:
    """The one of `choices` that `value` names, in any case (as settings are read from variables
    and flags alike); else a ConfigError naming it and them."""
    lowered = {c.lower(): c for c in choices}
    if str(value).lower() not in lowered:
        raise unknown(value, choices, name)
    return lowered[str(value).lower()]


def flag(value: str | bool, name: str) -> bool:
    """A flag's value: a bool, or 1/0, true/false, yes/no, on/off in any case; else a ConfigError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r} is not a flag; use 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Settings:
    """What the handle, the optimizers and the Planner are told to do. Build with `Settings.load(...)`."""

    policy: str = "powerOfTwo"
    workspace_limit: int = 64 * 2**20  # per kernel, WR
    total_limit: int | None = None  # whole network, WD; None: workspace_limit x kernels
    optimizer: str = PER_KERNEL.name
    execution: str = "graph"  # how a kernel's calls run, and so how it is benchmarked (ucudnn.execute.graphs)
    backend: str = ""  # candidates from: all, engines, legacy; "": all where the frontend imports (ucudnn.execute.backends)
    search: str = "pruned"  # how much of the candidate space a benchmark times (ucudnn.optimizers.search)
    solver: str = FIRST_INSTALLED  # WD's ILP solver; "": the first installed (ucudnn.optimizers.solvers)
    progress: bool = True  # a line on stderr while planning takes long (ucudnn.core.progress)
    planning: str = "between_iterations"  # ucudnn.plan.planner: when a framework's layer is planned (PLANNINGS)
    # ucudnn.plan.kernels, WR: a stride-1 layer's BD also planned as a forward convolution of dy, the
    # faster plan kept (ucudnn.core.transposition; docs/results.md, "both limits in one run")
    bd_as_forward: bool = True
    verbose: bool = False  # each kernel's plan on stderr as it is made (ucudnn.plan.assignment)
    cache_path: str | None = None  # None: as ucudnn.measure.cache.paths.cache_path decides
    # ucudnn.plan.planner: each kernel's limit from what its moment in a training step leaves free
    # (ucudnn.plan.memory) instead of the limits; what the limits say with a timeline (load(timeline=True))
    auto: bool = False
    # ucudnn.plan.planner, WR: a layer ucudnn would not speed up runs the framework's own convolution
    # (ucudnn.plan.delegation); a keyword of ucudnn.torch's convert() and Context
    delegate: bool = True

    @property
    def optimizing(self) -> Optimizer:
        """The optimizer the `optimizer` setting names (ucudnn.optimizers)."""
        return REGISTRY[self.optimizer]

    @property
    def searching(self) -> Search:
        """The search the `search` setting names, for this optimizer: one dividing a total measures
        every size of the policy (its cap, the total, says nothing of one kernel's share)."""
        return named(self.search, walk=not self.optimizing.divides)

    def sizes(self, batch: int) -> tuple[int, ...]:
        """The micro-batch sizes the batch size policy considers for a mini-batch of `batch`."""
        return batch_sizes(self.policy, batch)

    def backends(self, *, gpu: bool = True) -> tuple[str, ...]:
        """The backends whose candidates are considered. Offline (gpu=False) the unset default
        is every backend, whatever is installed: measurements of any can be used."""
        from ..execute.backends import resolve

        return resolve(self.backend, frontend=None if gpu else True)

    def sizes_for(self, problem: ConvProblem) -> tuple[int, ...]:
        """sizes() of a kernel's batch (what benchmark.ensure_tables asks for)."""
        return self.sizes(problem.batch)

    def limit(self, kernels: int) -> int:
        """The optimizer's limit in bytes: per kernel (WR), or for `kernels` distinct kernels
        together (WD)."""
        return self.total(kernels) if self.optimizing.divides else self.workspace_limit

    def total(self, kernels: int) -> int:
        """WD's total for a network of `kernels` distinct kernels: total_limit, else the
        per-kernel limit times the kernels."""
        total = self.total_limit
        return self.workspace_limit * kernels if total is None else total

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, *, timeline: bool = False,
             labels: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Keyword arguments win over UCUDNN_* variables (`variables()`), which win over the
        defaults. An argument also wins over a variable that contradicts it (_contradicted), and a
        total limit means WD (_one_meaning). A limit variable of AUTO reads as unset; `timeline`:
        the caller plans within a memory timeline (ucudnn.torch), where limits from it (`auto`)
        are the default and a limit of AUTO asks for them (_from_timeline). `labels`: the name an
        error shows for an argument (a command's flag, "--workspace"), else its keyword."""
        env = os.environ if env is None else env
        names = {f.name for f in fields(cls)}
        refused = set(overrides) - (names - {"auto"})
        if refused:
            raise ConfigError(_refusal(sorted(refused), sorted(names - {"auto"})))
        refuse_misnamed(env)
        # each value with the name an error should show: the variable the user set, or the argument
        from_env = {name: (env[variable], variable) for variable, name in variables().items()
                    if variable in env and not (name in LIMITS and _is_auto(env[variable]))}
        labels = labels or {}
        given = {k: (v, labels.get(k, k)) for k, v in overrides.items() if v is not None}
        parsed = {k: _PARSERS[k](value, label) for k, (value, label) in (from_env | given).items()}
        for name in [name for name in from_env if name not in given and _contradicted(name, parsed, given)]:
            del from_env[name], parsed[name]
        said = from_env | given
        parsed = _from_timeline(_one_meaning(parsed, said, given), said, timeline)
        return replace(cls(), **parsed)


_UNREAD = ("auto", "delegate")  # settings no variable sets: see their comments in Settings


def variables() -> dict[str, str]:
    """Each UCUDNN_* variable Settings.load reads -> the setting it sets."""
    return {CACHE_VARIABLE if f.name == "cache_path" else f"UCUDNN_{f.name.upper()}": f.name
            for f in fields(Settings) if f.name not in _UNREAD}


# Keywords that are not Settings', with where they go
_ELSEWHERE = {"concurrent_backward": "ucudnn.torch's (ucudnn.integrations.torch.options): pass it to "
                                     "ucudnn.torch.convert() or ucudnn.torch.Context()",
              "auto": "what the limits say: pass workspace_limit='auto' to ucudnn.torch.convert() or Context()"}


def _refusal(refused: list[str], known: list[str]) -> str:
    elsewhere = [f"{name} is {_ELSEWHERE[name]}" for name in refused if name in _ELSEWHERE]
    unknown = [name for name in refused if name not in _ELSEWHERE]
    return "; ".join(elsewhere + ([f"unknown setting(s) {unknown}; known: {known}"] if unknown else []))


def _contradicted(name: str, parsed: Mapping, given: Mapping) -> bool:
    """Whether the arguments `given` contradict setting `name`'s value from its variable: a total
    limit is WD's, so the per-kernel limit (WR's) or a per-kernel optimizer given contradicts one,
    and a total given contradicts a per-kernel optimizer; a limit of AUTO given is both limits,
    and contradicts either."""
    per_kernel = not REGISTRY[parsed.get("optimizer", PER_KERNEL.name)].divides
    if name in LIMITS and any(parsed.get(limit) == AUTO for limit in LIMITS if limit in given):
        return True
    if name == "total_limit":
        return "workspace_limit" in given or ("optimizer" in given and per_kernel)
    return name == "optimizer" and "total_limit" in given and per_kernel


def _said(label: str, value: Any) -> str:
    """A value as its user gave it: `--flag value` for a command's flag, else `name='value'`."""
    return f"{label} {value}" if label.startswith("-") else f"{label}={value!r}"


def _as_given(size: Any, label: str) -> Any:
    """A size as a user writes one ("1.0GiB") where a command's flag (`label`) parsed it to bytes."""
    flag = label.startswith("-") and isinstance(size, int) and not isinstance(size, bool)
    return format_size(size).replace(" ", "") if flag else size


def _one_meaning(parsed: dict[str, Any], said: Mapping[str, tuple], given: Mapping) -> dict[str, Any]:
    """A total workspace limit is WD's (the one home of this rule: the CLI, the handle and
    ucudnn.torch load through it): given one, the optimizer is WD; a per-kernel optimizer named
    too is an error, and so are both limits given as arguments (WD divides the total, and the
    per-kernel limit only sets a total where none is given), each named where it was set
    (argument, flag or variable). Two limits of AUTO are one."""
    if "total_limit" not in parsed:
        return parsed
    total, total_label = said["total_limit"]
    if "workspace_limit" in given and "total_limit" in given and {parsed[name] for name in LIMITS} != {AUTO}:
        limit_label = said["workspace_limit"][1]
        raise ConfigError(f"{limit_label} is not used beside {total_label}: WD divides the total, and "
                          f"{limit_label} only sets a total where none is given (the kernels times it); "
                          f"give one of them")
    if REGISTRY[parsed.get("optimizer", PER_KERNEL.name)].divides:
        return parsed
    if "optimizer" in parsed:
        optimizer, optimizer_label = said["optimizer"]
        raise ConfigError(f"{_said(total_label, _as_given(total, total_label))} is the WD optimizer's limit, but "
                          f"{_said(optimizer_label, optimizer)} plans each kernel alone; drop one of them, or use "
                          f"{_said(optimizer_label, DIVIDING.name)}")
    return parsed | {"optimizer": DIVIDING.name}


def _from_timeline(parsed: dict[str, Any], said: Mapping[str, tuple], timeline: bool) -> dict[str, Any]:
    """Limits from the memory timeline (`auto`, ucudnn.plan.memory), where the caller has one:
    asked for by AUTO as either limit, or by default, where no limit is set and no optimizer
    dividing a total is named (WD's default is the paper's, the per-kernel limit times the
    kernels). They are planned per kernel (ucudnn.plan.memory says why WD's division is the same),
    the fixed limits unused. Without a timeline a limit of AUTO is an error naming it."""
    asked = [name for name in LIMITS if parsed.get(name) == AUTO]
    if asked and not timeline:
        label = said[asked[0]][1]
        raise ConfigError(f"{_said(label, AUTO)} asks for limits from the memory timeline of a training step, "
                          f"which only ucudnn.torch plans within; give a size: {SIZE_FORMS}")
    dividing = REGISTRY[parsed.get("optimizer", PER_KERNEL.name)].divides
    default = not dividing and not any(name in parsed for name in LIMITS)
    if not asked and not (timeline and default):
        return parsed
    return {name: value for name, value in parsed.items() if name not in LIMITS} | {
        "auto": True, "optimizer": PER_KERNEL.name}


def _limit(value: str | int, name: str) -> int | str:
    """A limit: a size, or AUTO (limits from the memory timeline, _from_timeline)."""
    return AUTO if _is_auto(value) else parse_size(value, name)


_PARSERS: dict[str, Callable[[Any, str], Any]] = {  # (value, the name an error shows) -> the setting
    "policy": lambda v, n: choice(v, POLICIES, n),
    "workspace_limit": _limit,
    "total_limit": _limit,
    "optimizer": lambda v, n: choice(v, OPTIMIZERS, n),
    "execution": lambda v, n: choice(v, EXECUTIONS, n),
    "backend": lambda v, n: choice(v, BACKEND_CHOICES, n),
    "search": lambda v, n: choice(v, tuple(SEARCHES), n),
    "solver": lambda v, n: choice(v, tuple(SOLVERS), n),
    "progress": flag,
    "planning": lambda v, n: choice(v, PLANNINGS, n),
    "bd_as_forward": flag,
    "verbose": flag,
    "cache_path": lambda v, n: str(v),
    "delegate": flag,
}
