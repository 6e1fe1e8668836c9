"""Host time of ucudnn.torch's path per layer call, on the CPU: the whole Python path of a
converted convolution (Conv2d.forward, prepare, the autograd Function, Context.run, the kernel
object, a GraphedProgram) with kernels that do nothing, so what is timed is the host work
ucudnn adds around cuDNN's own calls. Assignments come from the CPU tests' fake benchmarker.

    PYTHONPATH=.:tests python3 bench/host_path_cpu.py [--calls 2000] [--profile 25]

Prints microseconds per forward (no grad) and per F+BD+BF step for an NCHW fp32 layer and an
autocast fp16 channels_last one, beside torch's own layer on the same (tiny) CPU tensors, whose
times include its CPU convolutions; then (with --profile N) cProfile's top N of ucudnn's steps.
Last, a delegated layer (torch's own kernels timed as instant, so the layer runs torch's
convolution) against torch's own layer on a 1x1x1x1 input, forward with and without gradients:
what a converted layer that ucudnn leaves to torch adds per call.
"""
from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import tempfile
import time
import timeit
from pathlib import Path

import torch
from torch import nn

import ucudnn.torch as ut
from torch_doubles import NumpyFramework, NumpyHandle
from ucudnn.measure.cache import Cache
from ucudnn.plan.delegation import OwnTiming
from ucudnn.core.progress import IDLE_S
from ucudnn.execute.graphs import GraphedProgram
from ucudnn.integrations.torch.kernels import TorchFramework


class NullCapturer:
    """Graphs that are never run: a launch costs nothing, as the GPU's replay costs the host ~nothing."""

    def capture(self, run):
        return run

    def launch(self, graph) -> None:
        pass

    def capturing(self) -> bool:
        return False


class NullHandle(NumpyHandle):
    """The tests' handle whose compiled programs do nothing, graph-launched as on the GPU."""

    def program(self, problem, configuration, alpha=1.0, beta=0.0):
        return GraphedProgram(lambda *operands: None, NullCapturer(), problem.describe())


class NullFramework(NumpyFramework):
    """CPU tensors stand in for CUDA ones; operands are their addresses, as on the GPU."""

    handle_class = NullHandle
    operand = TorchFramework.operand


CASES = {"nchw fp32": (False, False), "channels_last autocast fp16": (True, True)}


def layer(context, channels_last: bool) -> nn.Module:
    """The layer timed: converted into `context`, or torch's own (computing on the CPU) for None."""
    conv = nn.Conv2d(8, 8, 3, padding=1)
    if context is not None:
        ut.convert(conv, context=context)
    return conv.to(memory_format=torch.channels_last) if channels_last else conv


def runner(conv, x, amp: bool, backward: bool):
    autocast = torch.autocast("cpu", dtype=torch.float16, enabled=amp)

    def forward_only():
        with torch.no_grad(), autocast:
            conv(x)

    def step():
        with autocast:
            y = conv(x)
        y.backward(dy)
        conv.weight.grad = conv.bias.grad = x.grad = None

    if backward:
        with autocast:
            dy = torch.ones_like(conv(x))
    return step if backward else forward_only


def per_call_us(run, calls: int) -> float:
    for _ in range(20):
        run()
    best = float("inf")
    for _ in range(5):  # best of 5: the least disturbed measurement
        began = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - began) / calls * 1e6)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N of the steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        # planned on a layer's first call: between iterations, a training call's site would wait for
        # the first site, here the no_grad call's of the first case, which is not called again
        context = ut.Context(framework=NullFramework(), cache=Cache(Path(tmp) / "bench.db"), workspace_limit="64MiB",
                             planning="first_call")
        for (name, (channels_last, amp)), which in itertools.product(CASES.items(), ("ucudnn", "torch")):
            conv = layer(context if which == "ucudnn" else None, channels_last)
            x = torch.randn(2, 8, 4, 4)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_()
            forward_us = per_call_us(runner(conv, x, amp, backward=False), args.calls)
            step = runner(conv, x, amp, backward=True)
            step_us = per_call_us(step, args.calls)
            print(f"{which:6s} {name:28s} forward {forward_us:6.1f} us   F+BD+BF step {step_us:6.1f} us")
            if args.profile and which == "ucudnn":
                profile = cProfile.Profile()
                profile.runcall(lambda: [step() for _ in range(args.calls)])
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        assert not context.fallbacks and set(context.runs) == {("ucudnn", kind) for kind in ("F", "BD", "BF")}, context.runs
        delegated_overhead(Path(tmp), args.calls)


def delegated_overhead(tmp: Path, calls: int, rounds: int = 5, layers: int = 16) -> None:
    """A stack of `layers` converted layers that run torch's own convolution against the same
    stack of torch's layers, per layer call: best of `rounds` interleaved rounds, so that both
    meet the same state of the machine. A stack, not one layer in a loop: in a model other code
    runs between two layer calls, and a lone layer timed in a loop flatters the one with the
    least Python around it (caches stay warm)."""
    instant = NullFramework(lambda problem: OwnTiming(0.0, 0))
    context = ut.Context(framework=instant, cache=Cache(tmp / "delegated.db"), workspace_limit="64MiB",
                         planning="first_call")
    torch.manual_seed(0)
    theirs = nn.Sequential(*[nn.Conv2d(1, 1, 1) for _ in range(layers)])
    ours = ut.convert(nn.Sequential(*[nn.Conv2d(1, 1, 1) for _ in range(layers)]), context=context)
    x = torch.randn(1, 1, 1, 1)
    for grad in (False, True):
        xi = x.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            ours(xi)
            time.sleep(IDLE_S)  # the planning stretch ends: from the next call on the layers are steady
            runs = {name: (lambda model=model: model(xi)) for name, model in (("torch", theirs), ("delegated", ours))}
            best = dict.fromkeys(runs, float("inf"))
            for _ in range(rounds):
                for name, run in runs.items():  # many short blocks: the least disturbed one counts
                    best[name] = min(best[name], min(timeit.repeat(run, number=50, repeat=calls // 50)) / 50 / layers * 1e6)
        print(f"delegated 1x1 layers, {'grad   ' if grad else 'no grad'}: per layer call torch {best['torch']:5.2f} us, "
              f"converted {best['delegated']:5.2f} us, difference {best['delegated'] - best['torch']:5.2f} us")
    assert set(context.runs) == {("torch", "layer")}, context.runs


if __name__ == "__main__":
    main()
