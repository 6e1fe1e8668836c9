"""The commands that plan and measure (bench, optimize), the paper's figures (paper) and the one
that shows networks (nets)."""
from __future__ import annotations

import os
import textwrap
import time
from dataclasses import replace

from ..core.errors import ConfigError, GpuUnavailableError
from ..core.fallback import say_once
from ..core.log import say_plan
from ..core.nets import Network, find_kernel, get_network, list_networks, torchvision
from ..core.problem import Kernel, default_math
from ..core.progress import Progress, counted
from ..core.staging import slices_of
from ..execute import gpu
from ..measure.cache.paths import cache_path
from ..measure.parallel import bench_devices, bench_on_devices, bench_with_mpi
from ..optimizers.pareto import desirable_set
from ..paper import CANDIDATES, FIGURES, Executed, Predicted, write_figures
from ..plan.config import Settings, format_size, timeline_limits
from ..plan.solve import measured_in, plan
from ..plan.sources import gpu_available, tables_for
from ..reports.coverage import Request, explain_missing
from ..reports.plots import plot_report
from ..reports.report import Report, make_report
from .output import ProgressBar, device_json, dims, print_json, render_report, table

# The flag of each setting a command takes, as errors name it (Settings.load's labels)
FLAGS = {"workspace_limit": "--workspace", "total_limit": "--total-workspace", "optimizer": "--optimizer",
         "policy": "--policy", "cache_path": "--cache", "execution": "--execution", "backend": "--backend",
         "search": "--search", "solver": "--solver"}


def _settings(args) -> Settings:
    """The settings of `optimize` and `bench`, from their flags (Settings.load's rules, a total
    limit meaning WD among them), then the UCUDNN_* variables."""
    _say_no_timeline(args)
    return Settings.load(labels=FLAGS, policy=args.policy, workspace_limit=getattr(args, "workspace", None),
                         total_limit=getattr(args, "total_workspace", None), optimizer=getattr(args, "optimizer", None),
                         cache_path=args.cache, execution=args.execution, backend=getattr(args, "backend", None),
                         search=getattr(args, "search", None), solver=getattr(args, "solver", None))


def _say_no_timeline(args) -> None:
    """A limit variable of auto (config.timeline_limits) reads as unset, as no training step gives a
    memory timeline here: `optimize`, which plans at the limit, says so in a line, unless a flag
    sets the limit."""
    if args.command != "optimize" or args.workspace is not None or args.total_workspace is not None:
        return
    for variable in timeline_limits(os.environ):
        say_once(f"ucudnn: {variable}=auto asks for limits from the memory timeline of a training step "
                 f"(ucudnn.torch), which `ucudnn optimize` has not: it plans at the default, "
                 f"{format_size(Settings.workspace_limit)} per kernel (--workspace SIZE sets another)")


def kernels_of(args) -> tuple[Network, list[Kernel]]:
    """The network and its kernels; args.batch, if not given, becomes the network's default."""
    network = get_network(args.net)
    args.batch = args.batch or network.default_batch
    args.math = args.math or default_math(args.dtype)  # printed with the plan
    return network, network.problems(args.batch, args.dtype, args.math, args.layout)


def request_of(args, settings: Settings | None = None) -> Request:
    """What `args` ask for (after kernels_of); with `settings`, at their policy and backends."""
    request = Request(args.net, args.batch, args.dtype, args.layout, args.math)
    if settings is None:
        return request
    return replace(request, policy=settings.policy, backends=settings.backends(gpu=False))


def _bar(kernels: list[Kernel]) -> ProgressBar:
    return ProgressBar({k.problem.key: k.name for k in kernels})


def bench(args) -> int:
    settings = replace(_settings(args), search="full")  # what a database is filled with to share
    network, kernels = kernels_of(args)
    if not gpu_available():
        raise GpuUnavailableError("ucudnn bench measures on an NVIDIA GPU with cuDNN and none is usable here; "
                                  "`ucudnn optimize` plans from recorded measurements without one")
    progress = _bar(kernels)
    start = time.monotonic()
    devices = bench_devices(args.devices, args.mpi)
    if args.mpi or args.timing != "default" or devices is None or len(devices) > 1:
        device, path = _bench_on_devices(kernels, settings, devices, progress, args)
        if device is None:  # an MPI rank other than 0, which reports for all
            return 0
    else:
        with gpu.cupy().cuda.Device(devices[0]):
            found = tables_for([k.problem for k in kernels], settings, None, measure=True, progress=progress)
        device, path = found.device, found.path
    summary = {"network": network.name, "batch": args.batch, "kernels": len(kernels),
               "sizes": list(settings.sizes(args.batch)),
               "device": device.describe(), "database": str(path), "seconds": time.monotonic() - start}
    if args.json:
        print_json(summary)
    else:
        print(f"measured {summary['kernels']} kernels of {network.name} at batch {args.batch} "
              f"(micro-batch sizes {', '.join(map(str, summary['sizes']))}) on {summary['device']} "
              f"into {path} in {summary['seconds']:.1f} s")
    return 0


def _bench_on_devices(kernels, settings: Settings, devices: list[int] | None, progress, args=None):
    """Several GPUs (parallel.bench_on_devices), the ranks of an MPI job (bench_with_mpi), or
    --timing other than default; the device is None at MPI ranks other than 0."""
    path = cache_path(settings.cache_path)
    problems = [k.problem for k in kernels]
    sizes_for = settings.sizes_for
    timing, mpi = getattr(args, "timing", "default"), getattr(args, "mpi", None)
    if mpi or devices is None:  # every GPU of the node: MPI's ranks
        device = bench_with_mpi(problems, sizes_for, None, path, devices, shared=mpi == "shared",
                                progress=progress, timing=timing, execution=settings.execution,
                                backend=settings.backend)
    else:
        device = bench_on_devices(problems, sizes_for, None, path, devices, progress=progress, timing=timing,
                                  execution=settings.execution, backend=settings.backend)
    return device, path


def optimize(args) -> int:
    settings = _settings(args)
    line = Progress(settings.progress)  # a line on stderr once the command takes long
    line.step("reading the network", args.net)
    network, kernels = kernels_of(args)
    if args.kernel and not args.plot:
        raise ConfigError("--kernel picks the kernel --plot draws; add --plot FILE.png or drop --kernel")
    if args.kernel:
        find_kernel(kernels, args.kernel)
    measured = not args.offline and gpu_available()
    limit = settings.limit(len(kernels))
    request = request_of(args, settings)
    planned = f"{network.name}, {counted(len(kernels), 'kernel')}, {settings.optimizing.label}"
    line.step("measuring" if measured else "reading the measurements", planned)
    found = tables_for([k.problem for k in kernels], settings, limit, measure=measured,
                       progress=_bar(kernels) if measured else None,
                       explain=lambda exc, database, device: explain_missing(exc, database, device, network, request))
    tables, device, path = found.tables, found.device, found.path
    line.step("solving", planned)
    report = make_report(plan(kernels, settings, measured_in(tables)), settings)
    if settings.verbose:  # as the handle says each plan (README: UCUDNN_VERBOSE)
        for row in report.rows:
            say_plan(row.kernel.name, row.configuration, row.configuration.workspace)
    if args.plot:
        line.step(f"drawing {args.plot}", planned)
        _plot(args, network, report, tables, settings)
    line.finished()
    line.close(lambda: planned)
    if args.json:
        print_json({"network": network.name, "description": network.description, "batch": args.batch,
                    "dtype": args.dtype, "math": args.math, "layout": args.layout,
                    "device": device_json(device),
                    "measured": measured, "database": str(path), **report.to_json()})
    else:
        print(render_report(network, report, args, device, measured, path))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _plot(args, network: Network, report: Report, tables, settings: Settings) -> None:
    row = report.row(args.kernel) if args.kernel else report.most_improved()
    problem = row.kernel.problem
    front = desirable_set(tables[problem.key], problem.batch, settings.sizes(problem.batch),
                          report.limit, slices_of(problem))
    plot_report(report, row, front, args.plot,
                f"{network.name}, batch {args.batch}, {report.optimizer.upper()} at {format_size(report.limit)}")


def paper(args) -> int:
    settings = Settings.load(labels=FLAGS, cache_path=args.cache, solver=args.solver)
    numbers = list(FIGURES) if args.figure == "all" else [args.figure]
    if not args.measure and not args.execute:
        raise ConfigError("--no-measure says what --execute measures; add --execute, or leave --no-measure out")
    evidence = Executed(settings, progress=ProgressBar({}), measure_missing=args.measure) if args.execute \
        else Predicted(settings)
    with evidence:
        results, paths = write_figures(numbers, evidence, args.out)
        print(f"{evidence.describe()}; {evidence.timing()}\n")
    print(table(("figure", "what", "paper (P100-SXM2)", *(f"now: {c}" for c in CANDIDATES)),
                [(f"Fig. {n}", h.what, h.paper, *h.now) for n, result in results.items() for h in result.headlines]))
    print("\nwrote " + ", ".join(map(str, paths)))
    return 0


def nets(args) -> int:
    if args.name is None:
        networks = list_networks()
        if args.json:
            print_json([{"name": n.name, "description": n.description, "default_batch": n.default_batch,
                         "conv_layers": n.conv_layers, "distinct_layers": len(n.layers)} for n in networks])
        else:
            print(table(("network", "batch", "conv layers", "distinct", "description"),
                        [(n.name, n.default_batch, n.conv_layers, len(n.layers), n.description) for n in networks]))
            print("\nbatch: the default --batch, one the shipped recording covers")
            print(textwrap.fill(
                "also: a network file NAME.json (`ucudnn nets NAME --json` writes one) or a torchvision model by "
                "name (torchvision:NAME where a built-in table has that name). These ship traced: "
                + ", ".join(torchvision.shipped_names()) + "; any other is traced where torch and torchvision "
                "are installed", width=100, subsequent_indent="  "))
        return 0
    network = get_network(args.name)
    if args.json:
        print_json(network.to_json())
        return 0
    print(f"{network.name}: {network.description}; {network.conv_layers} conv layers, "
          f"{len(network.layers)} distinct (n: how many have that shape)\n")
    print(table(("layer", "n", "in", "out", "kernel", "stride", "pad", "dil", "groups", "input", "output",
                 "GFLOP/sample"),
                [(layer.name + (" (transposed)" if layer.transposed else ""), layer.count, layer.in_channels,
                  layer.out_channels, dims(layer.kernel),
                  dims(layer.stride), dims(layer.pad), dims(layer.dilation), layer.groups,
                  dims(layer.input_size), dims(layer.output_size),
                  f"{layer.problem('F', 1).flops() / 1e9:.3f}") for layer in network.layers]))
    return 0
