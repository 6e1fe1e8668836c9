"""A Planner's summary: its settings, every kernel planned, timed or seen in the step (its
configuration and workspace, or the framework's own), the seconds planning each took, the calls
run and, for WD, the solve: what benchmarks and ucudnn.torch's `summary()` report."""
from __future__ import annotations

from typing import Any

from ..core.problem import ConvKind
from ..plan.framework import UCUDNN
from ..plan.kernels import AsForward
from ..plan.memory import WATCHED_STEPS, workspace_limit
from ..plan.planner import Planner


def summary(planner: Planner) -> dict:
    """Settings, every kernel planned, timed or seen in the step: its configuration and
    workspace, or the framework's own (delegated, `swept` False where no sweep was needed), and
    the seconds its planning took; calls and (WD) the solve."""
    s, kernels, handles = planner.settings, planner.kernels, planner.kernels.handles.values()
    delegated = planner.delegation.delegated()
    keys = dict.fromkeys([*kernels.planned, *planner.delegation.own_timings, *planner.moments.in_step_ms])
    out: dict[str, Any] = dict(optimizer=s.optimizer, policy=s.policy, search=s.search,
                               workspace_limit="auto" if planner.auto else s.workspace_limit, delegate=planner.delegate,
                               planning_s=sum(kernels.seconds.values()), planning=s.planning, pending=len(planner.pending),
                               kernels=[_kernel(planner, kind, call, room, (kind, call, room) in delegated)
                                        for kind, call, room in keys],
                               runs={f"{via}:{kind}": n for (via, kind), n in planner.runs.items()})
    if planner.wd:
        out["wd"] = [dict(total_limit=h.wd_limit, total_workspace=r.total_workspace,
                          variables=r.variables, solve_seconds=r.solve_seconds, solver=r.solver)
                     for h in handles if (r := h.wd_result) is not None]
    out["cudnn_handles"] = dict(planner.framework.cudnn_handles)  # device -> whose handle: the framework's, or why not
    out["shrinks"] = [dict(kernel=s.what, failed=s.failed, limit=s.limit, why=s.why) for h in handles for s in h.shrinks]
    if planner.auto:
        watch = planner.flushes.watch
        out["flush_watch"] = dict(steps=min(watch.steps, WATCHED_STEPS), watched=watch.watched,
                                  kept=[kernel.problem.describe() for _, _, kernel in watch.kept])
    return out


def _kernel(planner: Planner, kind: ConvKind, call, room: int, delegated: bool) -> dict:
    """One kernel at one room (Kernels.room) for summary(): how it runs, its configuration and,
    where timed, the framework's own kernel (`delegated`: its layer runs that; no kernel: nor
    was it swept); with `auto` the room and ucudnn's limit within it."""
    key, moments = (kind, call, room), planner.moments
    kernel, own = planner.kernels.planned.get(key), planner.delegation.own_timings.get(key)
    out = dict(kind=kind.value, kernel=call.problem(kind).describe(),
               via=planner.framework.own if delegated or kernel is None else kernel.via, delegated=delegated,
               swept=kernel is not None, planning_s=planner.kernels.seconds[kind, call])
    if planner.auto:
        out.update(room=room, limit=workspace_limit(room))
    if own is not None:
        out.update(own_ms=own.ms, own_workspace=own.workspace)
    if key in moments.in_step_ms:  # its group's time in the step, and its site's windows
        out["in_step_ms"] = moments.in_step_ms[key]
        out["in_step_windows"] = [list(w) for w in moments.in_step_windows[key]]  # ms, flushes, grown
    if (kind, call) in planner.delegation.favourite_times:  # cuDNN's favourite, timed where its layer was pressed
        out["favourite_ms"] = planner.delegation.favourite_times[kind, call]
    if kernel is not None and kernel.via == UCUDNN:
        configuration = kernel.assignment.configuration
        if isinstance(kernel, AsForward):
            out["as_forward"] = kernel.inner.problem.describe()
        out.update(configuration=configuration.describe(), parts=len(configuration.micro),
                   workspace=kernel.assignment.workspace_size, predicted_ms=configuration.time_ms)
    return out
