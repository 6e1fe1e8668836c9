"""CPU: a converted layer left to torch's own convolution (delegated) whose calls hold steady runs
torch's layer at once: no signature lookup, no resolve, no Planner (ucudnn.integrations.torch.sites.Steady,
ucudnn.plan.planner.Planner.steady); whatever it was decided on changes, its next call is examined afresh."""
from __future__ import annotations

import contextlib
import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.core import progress  # noqa: E402
from ucudnn.integrations.torch import call as calls, layers  # noqa: E402
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.plan.framework import OwnTiming  # noqa: E402

from torch_doubles import NumpyFramework  # noqa: E402

LAYER = ("torch", "layer")


@pytest.fixture(autouse=True)
def prompt_progress(monkeypatch):
    """A stretch of planning ends at the first call that plans nothing (no half-second wait)."""
    monkeypatch.setattr(progress, "IDLE_S", 0.0)


def delegating(tmp_path, name: str = "bench.db", **settings) -> ut.Context:
    """A context whose layers are all left to torch: torch's kernels 'take' no time."""
    settings.setdefault("workspace_limit", "64KiB")
    settings.setdefault("planning", "first_call")
    return ut.Context(framework=NumpyFramework(lambda problem: OwnTiming(0.0, 0)), cache=Cache(tmp_path / name),
                      **settings)


def step(model, x):
    xi = x.clone().requires_grad_()
    y = model(xi)
    y.sum().backward()
    grads = [xi.grad] + [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [y.detach()] + grads


def count_examinations(monkeypatch, context) -> dict:
    """Counters of what a steady call skips: resolve's slow path, the sites' lookup, the Planner's route."""
    counts = {"resolve": 0, "lookup": 0, "route": 0}

    def counting(name, wrapped):
        def call(*args, **kwargs):
            counts[name] += 1
            return wrapped(*args, **kwargs)
        return call

    monkeypatch.setattr(calls, "_resolve", counting("resolve", calls._resolve))
    monkeypatch.setattr(context.sites, "get", counting("lookup", context.sites.get))
    monkeypatch.setattr(context.planner, "route", counting("route", context.planner.route))
    return counts


def two_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3))


def test_a_steady_delegated_call_skips_resolve_the_lookup_and_the_planner(tmp_path, monkeypatch):
    context = delegating(tmp_path)
    plain = two_layers()
    model = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):  # planned and delegated; then the planning stretch closes
        step(model, x)
    counts = count_examinations(monkeypatch, context)
    for _ in range(3):
        got = step(model, x)
    assert counts == {"resolve": 0, "lookup": 0, "route": 0}
    # every call ucudnn saw counted, steady ones too; the second layer retired after its
    # RETIRE_AFTER steady calls (the fourth step's) and ran the fifth as torch's own layer, unseen
    assert layers.RETIRE_AFTER == 2 and dict(context.runs) == {LAYER: 5 + 4}
    for a, b in zip(got, step(plain, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # torch's own layer


def _replace_weight(model, context, tmp_path, stack):
    model[0].weight = nn.Parameter(model[0].weight.detach() * 1)


def _another_context(model, context, tmp_path, stack):
    model[0].ucudnn_context = delegating(tmp_path, "other.db")


CHANGES = {  # name -> change(model, context, tmp_path, stack); the input of the calls after it where it changes
    "shape": lambda model, context, tmp_path, stack: torch.randn(3, 3, 9, 8),
    "grad mode": lambda model, context, tmp_path, stack: stack.enter_context(torch.no_grad()),
    "autocast": lambda model, context, tmp_path, stack: stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16)),
    "channels_last": lambda model, context, tmp_path, stack: model.to(memory_format=torch.channels_last),
    "weight replaced": _replace_weight,
    "frozen weight": lambda model, context, tmp_path, stack: model[0].weight.requires_grad_(False),
    "padding": lambda model, context, tmp_path, stack: setattr(model[0], "padding", (2, 2)),
    "reset": lambda model, context, tmp_path, stack: context.reset(),
    "context": _another_context,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_whatever_a_steady_layer_was_decided_on_changes_its_next_call_is_examined(change, tmp_path, monkeypatch):
    """After the change the first layer's call goes through the Planner again (and resolves where
    its signature changed); decided again, it is steady again."""
    context = delegating(tmp_path)
    model = ut.convert(two_layers(), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        model(x)
    counts = count_examinations(monkeypatch, context)
    examined_layers, forward = [], layers.Converted._forward
    monkeypatch.setattr(layers.Converted, "_forward", lambda self, input: examined_layers.append(self) or forward(self, input))
    with contextlib.ExitStack() as stack:
        changed = CHANGES[change](model, context, tmp_path, stack)
        x = changed if change == "shape" else x
        model(x)
        examined = dict(counts)
        assert model[0] in examined_layers  # its call was examined, not taken as steady
        for _ in range(2):
            model(x)
        counts.update(dict.fromkeys(counts, 0))
        model(x)
    if change == "context":  # the layer's calls go to its new context's Planner and count there
        other = model[0].ucudnn_context
        assert other is not context and other.runs[LAYER] == 4 and model[0]._ucudnn_steady.owner is other
        assert examined["route"] == 0  # the second layer stays steady
        return
    resolved = change != "weight replaced"  # the same signature: looked up, not resolved
    assert examined["route"] >= 1 and (examined["resolve"] >= 1) == resolved, examined
    assert counts == {"resolve": 0, "lookup": 0, "route": 0}


def test_the_first_site_plans_what_waits_though_it_is_steady(tmp_path):
    """The first site's calls start planning between iterations: while layers wait for a plan
    (here a new batch size), its calls go through the Planner, which plans them."""
    context = delegating(tmp_path, planning="between_iterations")
    model = ut.convert(two_layers(), context=context)
    x, other = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 8, 8)
    for _ in range(3):
        step(model, x)
    assert context.summary()["pending"] == 0 and model[0]._ucudnn_steady.site.steady
    step(model, other)  # two new sites, queued, run by torch meanwhile
    assert context.summary()["pending"] == 2 and not model[0]._ucudnn_steady.site.steady
    step(model, x)  # the first site's call plans them
    assert context.summary()["pending"] == 0


@pytest.mark.parametrize("copied", ["deepcopy", "pickle"])
def test_copies_of_a_steady_model_leave_its_steady_calls_behind(copied, tmp_path):
    """A layer's Steady belongs to its process and context: copies leave it behind."""
    context = delegating(tmp_path)
    model = ut.convert(two_layers(), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        model(x)
    assert model[0]._ucudnn_steady is not None
    twin = copy.deepcopy(model) if copied == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert twin[0]._ucudnn_steady is None
    if copied == "deepcopy":  # the same context, counted there
        twin(x)
        assert context.runs[LAYER] == 2 * 3


# --- retired layers: torch's class again --------------------------------------------------------

def test_a_delegated_layer_whose_calls_hold_steady_is_torch_s_own_layer_again_but_the_lead_s(tmp_path):
    """The second layer, steady for RETIRE_AFTER calls, takes nn.Conv2d's class back; the first,
    whose calls start iterations and watch for change, stays converted. The model computes what
    torch's does, context_of still finds the context, and summary() counts the retired layer."""
    context = delegating(tmp_path)
    plain = two_layers()
    model = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2 + layers.RETIRE_AFTER):
        step(model, x)
    assert type(model[2]) is nn.Conv2d and type(model[0]) is ut.Conv2d
    assert ut.context_of(model) is context and context.summary()["retired"] == 1
    for a, b in zip(step(model, x), step(plain, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def steady_then(tmp_path, change=None):
    """A two-layer model run until its second layer retired, then `change` (entered on a stack)
    and one more call: the model, its context and the input of that call."""
    context = delegating(tmp_path)
    model = ut.convert(two_layers(), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2 + layers.RETIRE_AFTER):
        step(model, x)
    assert type(model[2]) is nn.Conv2d
    return model, context, x


@pytest.mark.parametrize("change", ["shape", "grad mode", "autocast", "channels_last"])
def test_a_change_of_the_lead_layer_s_calls_converts_the_retired_layers_again(change, tmp_path):
    """A new batch shape, grad mode, autocast or memory format changes every call of the step, the lead's too:
    the retired layers are converted again and examine their calls (new sites), until steady."""
    model, context, x = steady_then(tmp_path)
    with contextlib.ExitStack() as stack:
        changed = CHANGES[change](model, context, tmp_path, stack)
        x = changed if change == "shape" else x
        resolved = context.sites.resolved
        model(x)
        assert type(model[2]) is ut.Conv2d and context.sites.resolved == resolved + 2  # both layers' new sites
        for _ in range(1 + layers.RETIRE_AFTER):
            model(x)
        assert type(model[2]) is nn.Conv2d  # steady again, retired again
    if change != "channels_last":  # the model stays channels_last; the others end with the stack
        model(torch.randn(2, 3, 8, 8))  # and back: the lead's site changed again
        assert type(model[2]) is ut.Conv2d


def test_reset_and_recording_convert_the_retired_layers_again(tmp_path):
    model, context, x = steady_then(tmp_path)
    context.reset()
    assert type(model[2]) is ut.Conv2d and context.summary()["retired"] == 0
    for _ in range(2 + layers.RETIRE_AFTER):
        model(x)
    assert type(model[2]) is nn.Conv2d
    with ut.network(model):  # recording: every layer's calls record
        assert type(model[2]) is ut.Conv2d
        model(x)


def test_a_retired_layer_converted_into_another_context_is_not_the_first_s_to_restore(tmp_path):
    model, context, x = steady_then(tmp_path)
    other = delegating(tmp_path, "other.db")
    ut.convert(model[2], context=other)
    assert type(model[2]) is ut.Conv2d and model[2].ucudnn_context is other
    for _ in range(2 + layers.RETIRE_AFTER):
        model[2](torch.randn(2, 4, 8, 8))  # its own lead in `other`: never retired there
    ut.convert(model[2], context=context)
    context.restore()  # model[2] is converted, not torch's: left as it is
    assert type(model[2]) is ut.Conv2d and model[2].ucudnn_context is context


def test_layers_made_directly_and_layers_of_two_shapes_a_step_never_retire(tmp_path, monkeypatch):
    """A ucudnn.torch.Conv2d made by hand stays one; a layer called with two shapes in a step
    holds no Steady for long (each call replaces the other's), so it keeps being examined."""
    context = delegating(tmp_path)
    lead, twice = ut.convert(nn.Conv2d(3, 3, 1), context=context), ut.convert(nn.Conv2d(3, 3, 3, padding=1),
                                                                           context=context)
    direct = ut.Conv2d(3, 3, 1)  # of the default context, here `context`
    monkeypatch.setattr(layers, "default_context", lambda: context)
    for _ in range(4 + layers.RETIRE_AFTER):
        y = lead(torch.randn(2, 3, 8, 8))
        twice(twice(y)[:, :, :6])
        direct(y)
    assert type(twice) is ut.Conv2d and type(direct) is ut.Conv2d and direct._ucudnn_steady.held > layers.RETIRE_AFTER


@pytest.mark.parametrize("copied", ["deepcopy", "pickle"])
def test_copies_of_a_model_with_retired_layers_run_and_find_their_context(copied, tmp_path):
    model, context, x = steady_then(tmp_path)
    twin = copy.deepcopy(model) if copied == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert type(twin[2]) is nn.Conv2d and "_ucudnn_steady" not in twin[2].__dict__
    found = ut.context_of(twin)
    assert (found is context) == (copied == "deepcopy")
    torch.testing.assert_close(twin(x), model(x), rtol=0, atol=0)
