"""CPU: one plan per job under torch.distributed (ucudnn/integrations/torch/distributed.py): rank 0
plans first, the other ranks after a barrier, from the database they share; torch.distributed's
functions are stood in for (no process group is started)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.plan.delegation import ROOMY_BYTES  # noqa: E402
from ucudnn.plan.framework import OwnTiming  # noqa: E402

from torch_doubles import NumpyFramework  # noqa: E402


@pytest.mark.parametrize("rank, order", [(None, ["plan"]), (0, ["plan", "barrier"]), (1, ["barrier", "plan"])])
def test_rank_zero_plans_first_and_the_others_after_a_barrier(rank, order, monkeypatch):
    done = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: rank is not None)
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "barrier", lambda: done.append("barrier"))
    assert ut.rank_zero_first(lambda: done.append("plan") or "planned") == "planned"
    assert done == order


def test_a_rank_after_rank_zero_plans_from_its_measurements(tmp_path):
    """Two 'ranks' (a Context each) on one database: the second times and measures nothing (torch's
    timings are kept where taken with ROOMY_BYTES free, docs/torch.md)."""
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    measured = []
    for rank in range(2):
        context = ut.Context(framework=NumpyFramework(lambda problem: OwnTiming(1.0, 2**40, ROOMY_BYTES)),
                             cache=Cache(tmp_path / "shared.db"), workspace_limit="64KiB")
        torch.manual_seed(0)
        model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3)), context=context)

        def plan():
            for _ in range(2):  # what a training step meets: its layers' kernels, queued
                model(x).sum().backward()
            return context.plan_pending()

        assert plan() == 0
        benchmarker = context.handle(torch.device("cpu")).assignments.benchmarker
        measured.append((len(context.framework.timed), benchmarker.calls))
    assert measured[0][0] == 6 and measured[0][1] > 0  # rank 0: torch's kernels timed (beyond the limit), ucudnn's swept
    assert measured[1] == (0, 0)
