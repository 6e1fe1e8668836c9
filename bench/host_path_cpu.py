"""Host time of a converted layer that ucudnn runs, on the CPU: the whole Python path of a call
(the layer's forward, the site's lookup, the autograd Function, Planner.run, the kernel object, a
GraphedProgram) with kernels that do nothing, so what is timed is the host work ucudnn adds around
cuDNN's own calls. Plans come from the CPU tests' fake benchmarker (tests/handle_doubles.py).

    PYTHONPATH=.:tests python3 bench/host_path_cpu.py [--calls 1000] [--profile 25]

Prints microseconds per forward (no grad) and per F+BD+BF step of an 8-channel 3x3 layer on a
(2, 8, 4, 4) input, best of 5 rounds of --calls calls, beside torch's own layer (whose times
include its CPU convolution); with --profile N, cProfile's top N of ucudnn's steps."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path


def per_call_us(run, calls: int) -> float:
    for _ in range(50):
        run()
    best = float("inf")
    for _ in range(5):  # best of 5: the least disturbed round
        began = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - began) / calls * 1e6)
    return best


def null_framework():
    """The tests' NumPy framework whose programs do nothing, graph-launched as on the GPU, and
    whose operands are addresses."""
    from ucudnn.execute.graphs import GraphedProgram
    from ucudnn.integrations.torch.kernels import TorchFramework

    from handle_doubles import NumpyHandle
    from torch_doubles import NumpyFramework

    class NullCapturer:
        def capture(self, run):
            return run

        def launch(self, graph) -> None:
            pass

        def capturing(self) -> bool:
            return False

    class NullHandle(NumpyHandle):
        def program(self, problem, configuration, alpha=1.0, beta=0.0):
            return GraphedProgram(lambda *operands: None, NullCapturer(), problem.describe())

    class NullFramework(NumpyFramework):
        handle_class = NullHandle
        operand = TorchFramework.operand

    return NullFramework()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N of ucudnn's steps")
    args = parser.parse_args(argv)
    import torch
    from torch import nn

    import ucudnn.torch as ut
    from ucudnn.measure.cache import Cache

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        context = ut.Context(framework=null_framework(), cache=Cache(Path(tmp) / "bench.db"), workspace_limit="64MiB",
                             planning="first_call", delegate=False)
        layers = {"torch": nn.Conv2d(8, 8, 3, padding=1), "ucudnn": ut.convert(nn.Conv2d(8, 8, 3, padding=1), context=context)}
        x, dy = torch.randn(2, 8, 4, 4, requires_grad=True), torch.ones(2, 8, 4, 4)

        def forward(layer):
            def run():
                with torch.no_grad():
                    layer(x)
            return run

        def step(layer):
            def run():
                layer(x).backward(dy)
                layer.weight.grad = layer.bias.grad = x.grad = None
            return run

        for name, call in (("forward", forward), ("F+BD+BF step", step)):
            print(name, *(f"{who} {per_call_us(call(layer), args.calls):.1f} us" for who, layer in layers.items()))
        if args.profile:
            profile, run = cProfile.Profile(), step(layers["ucudnn"])
            profile.enable()
            for _ in range(args.calls):
                run()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
