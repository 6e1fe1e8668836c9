"""The layers waiting for their plan (planning="between_iterations"): each runs the framework's own
convolution (its stand-in kernels) until planned, and planning runs in slices at the start of
iterations, at the lead site's call, so that the first iteration runs as the framework's own would
and no iteration carries all of it."""
from __future__ import annotations

from typing import Any

from ..core.budget import Slice, within
from .delegation import Delegation
from .framework import Framework, Site, scopes
from .moments import Moments


class Pending:
    """The sites waiting for their plan, oldest first (an ordered set), what each runs meanwhile
    (stand_in), and the lead: the site whose calls start iterations (leads). A site is planned
    once observed `observations` times (with `auto`, RECORDED_CALLS: its moments)."""

    def __init__(self, framework: Framework, delegation: Delegation, moments: Moments, observations: int) -> None:
        self.framework, self.delegation, self.moments, self.observations = framework, delegation, moments, observations
        self._sites: dict[Any, None] = {}
        self.lead: Any = None
        self._stand_ins: dict[tuple, Any] = {}  # (kind, call) -> what a waiting site runs

    def __contains__(self, site: Site) -> bool:
        return site in self._sites

    def __len__(self) -> int:
        return len(self._sites)

    def leads(self, site: Site) -> bool:
        """Whether a new site's calls start iterations from now on: the first site, or the first
        with backward kernels where the lead has none (a validation pass run before training,
        as PyTorch Lightning's sanity check does, would else start planning only at the next one)."""
        lead = self.lead
        return lead is None or (len(lead.kinds) == 1 and len(site.kinds) > 1)

    def wait(self, site: Site) -> None:
        """Queue the site; the lead's calls route again, to start its planning."""
        self._sites[site] = None
        self.lead.steady = False

    def drop(self, site: Site) -> None:
        """The site waits no more (decided elsewhere: Planner.settle)."""
        self._sites.pop(site, None)

    def stand_in(self, site: Site, kind):
        """The kernel a waiting site runs: the framework's own, or what replaced it (rescue());
        one per call and kind."""
        key = kind, site.call
        if key not in self._stand_ins:
            self._stand_ins[key] = self.framework.own_kernel(site.call.problem(kind))
        return self._stand_ins[key]

    def rescue(self, site: Site, kind, kernel) -> None:
        """`kernel` stands in for the site's `kind` from now on (its stand-in ran out of memory)."""
        self._stand_ins[kind, site.call] = kernel

    def plan(self, budget_s: float | None = None) -> int:
        """Plan the waiting layers, oldest first, until `budget_s` seconds have gone (None: all of
        them), checked between kernels: each call plans something (a kernel, or a layer decided)
        either way; a sweep in force (core.budget.within) ends between two of its rounds once the
        slice is spent, and the next slice goes on from what it measured. Only layers observed
        `observations` times are planned. A layer runs as planned from its next call once all its
        kernels are. Returns how many layers still wait. Between iterations only."""
        budget = Slice.lasting(budget_s)
        with scopes(self.framework) as enter, within(budget):
            for site in [s for s in self._sites if s.observed >= self.observations]:
                if budget.spent():
                    break
                enter(site.call.device)
                if not self._plan(site, budget):
                    break
                budget.worked = True
        return len(self._sites)

    def _plan(self, site: Site, budget: Slice) -> bool:
        """Plan one waiting layer; whether it is planned (False: the budget ran out between two of
        its kernels). Its rooms are lessened first by what the process came to hold outside the
        framework's pool since they were observed (Moments.lessen)."""
        self.moments.lessen(site)
        if self.delegation.plan(site, budget) is None:
            return False
        self.moments.forget(site)
        del self._sites[site]
        site.delegated = None
        return True

    def reset(self) -> None:
        self._sites.clear()
        self._stand_ins.clear()
        self.lead = None
