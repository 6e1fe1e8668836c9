"""What converted layers share: settings, a ucudnn.Handle per GPU, planned kernels by call
site: ucudnn.plan.planner.Planner with torch's side (TorchFramework), the sites of layer calls, WD's
learning of the network, and the side stream of a concurrent backward."""
from __future__ import annotations

import contextlib
import os
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from typing import Any

import torch
from torch import nn

from ...core.errors import ConfigError
from ...measure.cache import Cache
from ...plan.config import Settings, format_size
from ...plan.memory import AUTO
from ...plan.planner import Planner
from ...reports.summary import summary
from .kernels import TorchFramework
from .options import TorchOptions
from .sites import Sites

_UNCHANGED = contextlib.nullcontext()  # reusable: entering it does nothing
_SERIAL = contextlib.nullcontext(lambda *tensors: _UNCHANGED)  # Context.beside with one stream


class Context:
    """What converted layers share: settings, the Planner of their calls (`planner`: one
    ucudnn.Handle per GPU, the planned kernels), the sites of layer calls (sites.py) and, for WD,
    the recording of the network's kernels before the one solve. What a user reads of it:
    summary(), runs, recording(), reset(), plan_pending(), handle().

    Keyword arguments as `convert` takes them (None: UCUDNN_* variables, then defaults; the
    limits' default is AUTO: Settings.load with a timeline); `delegate` beside `settings` too, and
    `concurrent_backward` (options.TorchOptions)."""

    def __init__(self, settings: Settings | None = None, *, framework: TorchFramework | None = None,
                 cache: Cache | None = None, workspace_limit: int | str | None = None, optimizer: str | None = None,
                 policy: str | None = None, total_limit: int | str | None = None, cache_path: str | None = None,
                 execution: str | None = None, planning: str | None = None, delegate: bool | None = None,
                 concurrent_backward: bool | None = None) -> None:
        given: dict[str, Any] = dict(workspace_limit=workspace_limit, optimizer=optimizer, policy=policy,
                                     total_limit=total_limit, cache_path=cache_path, execution=execution,
                                     planning=planning)
        if settings is not None and any(v is not None for v in given.values()):
            raise ConfigError("pass either settings= or keyword settings (workspace_limit, ...) to Context, not both")
        if settings is None:  # with torch's memory timeline: limits from it by default (Settings.load)
            settings = Settings.load(os.environ, timeline=True, delegate=delegate, **given)
        elif delegate is not None:
            settings = replace(settings, delegate=delegate)
        self.options = TorchOptions.load(os.environ, concurrent_backward=concurrent_backward)
        self.settings, self._framework = settings, framework or TorchFramework()
        self.planner = Planner(settings, self._framework, cache)
        self.sites = Sites()  # what layer calls resolve to, by signature (see sites.py)
        self._recording = False
        # WD without a sample input: the first pass runs through torch while recording (see learn_call()).
        self._learn_first_pass = settings.optimizing.divides
        self._seen: set[int] = set()
        self.fallbacks: Counter = Counter()  # reason -> layer calls that went to torch entirely
        self._retired: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> its converted class
        self._lead_layer: int | None = None  # id() of the layer of the lead site (Planner.is_lead)
        self._lead_seen: Any = None  # the site of that layer's last call examined

    @property
    def framework(self) -> TorchFramework:
        """torch's side of the Planner: the one its collaborators hold (given to Context, not set after)."""
        return self._framework

    @property
    def runs(self) -> Counter:
        """Kernel calls by (via, kind), layer calls that ran torch's own by ("torch", "layer")."""
        return self.planner.runs

    def handle(self, device: torch.device) -> Any:
        """The ucudnn.Handle of `device`, made on first use."""
        return self.planner.handle(device)

    def plan_pending(self, budget_s: float | None = None) -> int:
        """Plan the layers waiting for their plan now (planning 'between_iterations'), for about
        `budget_s` seconds (None: all of them); how many still wait."""
        return self.planner.plan_pending(budget_s)

    # Converted models share their context when deep-copied, and rebuild it from its settings and
    # options when unpickled.
    def __deepcopy__(self, memo) -> Context:
        return self

    def __reduce__(self):
        return (_rebuild_context, (self.settings, self.options))

    def beside(self, device: torch.device) -> contextlib.AbstractContextManager[Callable[..., Any]]:
        """For a layer's backward: inside, `with aside(*tensors):` runs its kernels on a side
        stream that first waits for the current one (options.concurrent_backward; else on the
        current stream, at no cost beyond two reused no-op contexts), the tensors kept from reuse
        until that stream is done with them; on the way out the current stream waits for it."""
        if not self.options.concurrent_backward:
            return _SERIAL
        return self.framework.side_stream(device)

    # WD: learning the network first
    def learn_call(self, module: nn.Module) -> bool:
        """Take this call of `module` while the network is learned: True where it only records its
        kernels (and runs through torch): inside `recording()`, and for WD without a sample input
        through the first pass, which ends, and the network is solved, when a layer is called a
        second time."""
        if self._recording:
            return True
        if not self._learn_first_pass:
            return False
        if id(module) not in self._seen:
            self._seen.add(id(module))
            return True
        self._learn_first_pass = False
        self._seen.clear()
        self.planner.finalize()
        return False

    # Retired layers: delegated layers made torch's own again, so that their calls cost what torch's do
    def retire(self, module: nn.Module) -> None:
        """Give a converted layer whose calls hold steady (delegated, nothing to plan: sites.Steady)
        torch's own class back, so that its calls run torch's layer with nothing of ucudnn's in
        between (the steady check costs host-paced steps: docs/results.md, "Delegated
        layers retired"); not the lead's layer, whose calls start iterations and watch for change
        (saw). restore() converts it again."""
        if id(module) != self._lead_layer:
            twin: Any = type(module)  # a converted class, with its torch_class (layers.py imports this module)
            self._retired[module] = twin
            module.__dict__.pop("_ucudnn_steady", None)
            module.__class__ = twin.torch_class

    def saw(self, module: nn.Module, site: Any) -> None:
        """A converted layer's call was examined and routed to `site`. Where it is the lead's
        layer and its site changed (a new batch shape, grad mode, autocast, precision: the whole
        step's calls change with it), retired layers are restored to examine theirs afresh."""
        if self.planner.is_lead(site):
            self._lead_layer = id(module)
        if id(module) == self._lead_layer:
            if site is not self._lead_seen:
                self.restore()
            self._lead_seen = site

    def restore(self) -> None:
        """Convert the retired layers again (those still torch's class and of this context):
        their next calls are examined as any converted layer's."""
        for module, twin in list(self._retired.items()):
            if type(module) is twin.torch_class and module.__dict__.get("ucudnn_context") is self:
                module.__class__ = twin
        self._retired.clear()

    @contextlib.contextmanager
    def recording(self) -> Iterator[Context]:
        """Layers only record their kernels inside; on a clean exit the kernels are planned (WD:
        the network, known kernels included, is solved once)."""
        if self.planner.wd and self.planner.solved():
            self.reset()  # learning again: solve the known kernels and the new ones together
        self.restore()
        self.sites.reroute()  # every layer's calls record, steady ones too
        self._learn_first_pass, self._recording = False, True
        try:
            yield self
        finally:
            self._recording = False
        self.planner.finalize()

    def reset(self) -> None:
        """Forget every assignment and site: kernels are planned again on next use (WD: as one
        network), retired layers restored. Waits for the GPUs first, since running kernels may still
        use the old workspaces."""
        self.planner.reset()
        self.restore()
        self.sites.clear()

    def summary(self) -> dict:
        """The planner's summary (ucudnn.reports.summary; its `runs` count the calls ucudnn saw: a
        retired layer's are torch's alone), the layer calls that went to torch entirely, by
        reason, and the retired layers."""
        return {**summary(self.planner), "fallbacks": dict(self.fallbacks), "retired": len(self._retired)}

    @property
    def limit_name(self) -> str:
        """The per-kernel limit in words: 'auto' (from the memory timeline) or a size."""
        return AUTO if self.settings.auto else format_size(self.settings.workspace_limit)

    def __repr__(self) -> str:
        s = self.settings
        return f"ucudnn.torch.Context(optimizer={s.optimizer!r}, workspace_limit={self.limit_name}, policy={s.policy!r})"


def _rebuild_context(settings: Settings, options: TorchOptions) -> Context:
    return Context(settings, **asdict(options))


_default: Context | None = None


def default_context() -> Context:
    """The context of Conv2d layers made directly rather than by convert(): settings from UCUDNN_*."""
    global _default
    if _default is None:
        _default = Context()
    return _default
