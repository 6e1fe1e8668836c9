"""The `ucudnn` command: bench, optimize, cache and nets, a thin layer over the library.

Every command parses its flags, calls the library and prints text or, with --json, one JSON
document. Errors ucudnn raises on purpose print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from .config import OPTIMIZERS, POLICIES, Settings, format_size, parse_size
from .device import EXECUTIONS, DeviceInfo
from .errors import CacheError, ConfigError, GpuUnavailableError, MissingMeasurementsError, UcudnnError
from .nets import Kernel, Network, find_kernel, get_network, list_networks
from .report import Report, algo_name, make_report
from .problem import LAYOUTS, MATH_TYPES, default_math

DTYPES = ("float32", "float16", "bfloat16")


# ---- argument types: a bad value gets a one-line message that names it and the fix


def _batch(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer; give the mini-batch size, e.g. 256")
    return int(text)


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _devices(text: str) -> list[int]:
    parts = text.split(",")
    if not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU numbers; use e.g. 0 or 0,1")
    return [int(part) for part in parts]


def _output(text: str) -> Path:
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name such as {path / 'out.png'}")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied; choose a writable path")
    return path


def _plot_output(text: str) -> Path:
    from .plots import check_plot_path

    path = _output(text)
    try:
        check_plot_path(path)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return path


# ---- where measurements come from


def _gpu_available() -> bool:
    try:
        from .bindings import gpu_available
    except ImportError:
        return False
    return gpu_available()


def _read_path(cache: str | None):
    """Where commands that only read look: --cache, else $UCUDNN_CACHE, else the shipped recordings."""
    from .cache.paths import recorded_path

    return Settings.load(cache_path=cache).cache_path or recorded_path()


def _write_path(cache: str | None):
    """Where commands that measure or write go: --cache, else $UCUDNN_CACHE, else your cache file."""
    from .cache.paths import default_path

    return Settings.load(cache_path=cache).cache_path or default_path()


def _database(path, check: bool = True):
    """The benchmark database at `path`, read-only, checked whole unless `check` is False; an
    error naming the fix where there is none or it is damaged."""
    import sqlite3

    from .cache.database import BenchmarkDatabase

    if path is None:
        raise MissingMeasurementsError("no recorded measurements are shipped with this ucudnn; "
                                       "pass --cache FILE with a database from `ucudnn bench`")
    if not Path(path).is_file():
        raise CacheError(f"no benchmark database at {path}; pass --cache FILE with one from `ucudnn bench`")
    try:
        return BenchmarkDatabase(path, readonly=True, check=check)
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"{path} is not a usable benchmark database ({exc}); check the path") from None


def _target(path) -> Path:
    """A database a command writes into, checked as any output file is (its folder must exist);
    only ucudnn's own default folder is made."""
    from .cache.paths import default_path

    if Path(path) == default_path():
        return Path(path)
    try:
        return _output(str(path))
    except argparse.ArgumentTypeError as exc:
        raise CacheError(str(exc)) from None


def _devices_in(database) -> list[DeviceInfo]:
    """One provenance per (GPU, cuDNN, execution): what measurements are shared by."""
    return list({d.reuse_key: d for d in database.devices()}.values())


def _device_with_most(database, problems, path, execution: str) -> DeviceInfo:
    """Of the GPUs in a database measured for `execution`, the one with measurements of the
    most of these kernels."""
    every = _devices_in(database)
    devices = [d for d in every if d.execution == execution]
    if not devices:
        others = sorted({d.execution for d in every})
        hint = f"it has {' and '.join(others)} execution measurements: pass --execution {others[0]}, or " if others else ""
        raise MissingMeasurementsError(f"the database {path} holds no measurements timed for {execution} "
                                       f"execution; {hint}fill it with `ucudnn bench --execution {execution}` on a GPU")
    return max(devices, key=lambda d: sum(len(t) > 0 for t in database.tables(problems, d).values()))


def _tables(kernels: Sequence[Kernel], settings: Settings, cap: int | None, measure: bool, progress=None,
            network: Network | None = None, request=None):
    """Tables of every kernel by problem.key, complete for the policy's sizes within `cap` bytes
    and for the whole batch with no cap (the unlimited reference), with the device they are
    from and the database's path: measured here where `measure`, else read from the database
    (missing ones are an error that says what the database has of `network`)."""
    from .benchmark import ensure_tables
    from .coverage import explain_missing

    problems = [k.problem for k in kernels]
    if measure:
        from .benchmark import CudnnBenchmarker
        from .cache import Cache

        benchmarker = CudnnBenchmarker(execution=settings.execution)
        source, device, path = Cache(_write_path(settings.cache_path)), benchmarker.device, None
    else:
        benchmarker, path = None, _read_path(settings.cache_path)
        source = _database(path)
        device = _device_with_most(source, problems, path, settings.execution)
    try:
        ensure_tables(problems, settings.sizes_for, cap, source, benchmarker, progress,
                      device=device)
        tables = ensure_tables(problems, lambda p: (p.batch,), None, source, benchmarker, device=device)
    except MissingMeasurementsError as exc:
        if network is None or measure:
            raise
        raise explain_missing(exc, source, device, network, request) from None
    return tables, device, path or source.path


class ProgressBar:
    """One line on stderr: kernels done, time left and the kernel being measured."""

    def __init__(self, names: dict[str, str], stream=sys.stderr, width: int = 24):
        self.names, self.stream, self.width = names, stream, width
        self.start = time.monotonic()

    def __call__(self, done: int, total: int, problem) -> None:
        elapsed = time.monotonic() - self.start
        left = f"{elapsed / done * (total - done):.0f} s left" if done else "time left unknown"
        current = "done" if done == total else self.names.get(problem.key, problem.describe())
        bar = "#" * (self.width * done // max(total, 1))
        line = f"[{bar:<{self.width}}] {done}/{total} kernels, {left}, {current}"
        if self.stream.isatty():  # redraw in place
            self.stream.write(f"\r{line}\x1b[K" + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ---- text output


_NUMBER = re.compile(r"[\d.]+x?( [A-Za-z]+)?")


def _table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """Columns padded to their widest cell; a column of numbers (with a unit or x, or empty) is
    right-aligned."""
    cells = [[str(c) for c in row] for row in (headers, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_NUMBER.fullmatch(row[i]) for row in cells[1:] if row[i]) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric))
                     .rstrip() for row in cells)


def _dims(values) -> str:
    return "x".join(map(str, values))


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _render_report(network: Network, report: Report, args, device: DeviceInfo, measured: bool, path) -> str:
    where = "measured here" if measured else "recorded"
    limit = (f"WR, {format_size(report.limit)} per kernel" if report.optimizer == "wr"
             else f"WD, {format_size(report.limit)} in total")
    rows = [(r.kernel.name, r.kernel.count, r.describe(r.configuration), _ms(r.configuration.time_ms),
             format_size(r.configuration.workspace), _ms(r.undivided.time_ms), f"{r.speedup:.2f}x",
             _ms(r.best.time_ms)) for r in report.rows]
    rows.append(("total", sum(r.kernel.count for r in report.rows), "", _ms(report.time_ms()),
                 format_size(report.workspace), _ms(report.time_ms("undivided")), f"{report.speedup:.2f}x",
                 _ms(report.time_ms("best"))))
    lines = [
        f"{network.name}: {network.description}",
        f"batch {args.batch}, {args.dtype}, {args.layout}, math {args.math}; policy {report.policy}; {limit}",
        f"times are predicted from measurements {where} on {device.describe()} (database {path})",
        "",
        _table(("kernel", "n", "configuration", "ms", "workspace", "cuDNN ms", "speedup", "best ms"), rows),
        "",
        f"speedup over cuDNN undivided at {format_size(report.kernel_limit)} per kernel: {report.speedup:.2f}x "
        f"({_ms(report.time_ms('undivided'))} -> {_ms(report.time_ms())} ms per iteration, predicted)",
        f"unlimited best (cuDNN undivided, no workspace limit): {_ms(report.time_ms('best'))} ms with "
        f"{format_size(report.reference_workspace('best'))}; the plan takes {report.gap_to_best:.2f}x its time",
        "n: occurrences in the network; totals count the time of each, the workspace of each distinct kernel once",
    ]
    if report.solver:
        s = report.solver
        lines.append(f"WD: {s['variables']} binary variables, built in {s['build_seconds']:.3f} s, "
                     f"solved by {s['solver']} in {s['solve_seconds']:.3f} s")
    return "\n".join(lines)


def _device_json(device: DeviceInfo) -> dict:
    return {**asdict(device), "description": device.describe()}


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


# ---- commands


def _settings(args) -> Settings:
    optimizer = getattr(args, "optimizer", None)
    total = getattr(args, "total_workspace", None)
    if total is not None and optimizer == "wr":
        raise ConfigError("--total-workspace is the WD limit; drop it or use --optimizer wd")
    return Settings.load(batch_size_policy=args.policy, workspace_limit=getattr(args, "workspace", None),
                         total_workspace_limit=total, optimizer=optimizer,
                         cache_path=args.cache, execution=args.execution)


def _kernels(args) -> tuple[Network, list[Kernel]]:
    """The network and its kernels; args.batch, if not given, becomes the network's default."""
    network = get_network(args.net)
    args.batch = args.batch or network.default_batch
    args.math = args.math or default_math(args.dtype)  # printed with the plan
    return network, network.problems(args.batch, args.dtype, args.math, args.layout)


def _request(args, settings: Settings):
    from .coverage import Request

    return Request(args.net, args.batch, args.dtype, args.layout, args.math, settings.batch_size_policy)


def bench(args) -> int:
    settings = _settings(args)
    network, kernels = _kernels(args)
    if not _gpu_available():
        raise GpuUnavailableError("ucudnn bench measures on an NVIDIA GPU with cuDNN and none is usable here; "
                                  "`ucudnn optimize` plans from recorded measurements without one")
    progress = ProgressBar({k.problem.key: k.name for k in kernels})
    start = time.monotonic()
    devices = _bench_devices(args)
    if args.mpi or args.timing != "default" or len(devices) > 1:
        device, path = _bench_on_devices(kernels, settings, devices, progress, args)
        if device is None:  # an MPI rank other than 0, which reports for all
            return 0
    else:
        from . import gpu

        with gpu.cupy().cuda.Device(devices[0]):
            _, device, path = _tables(kernels, settings, None, measure=True, progress=progress)
    summary = {"network": network.name, "batch": args.batch, "kernels": len(kernels),
               "sizes": list(settings.sizes(args.batch)),
               "device": device.describe(), "database": str(path), "seconds": time.monotonic() - start}
    if args.json:
        _print_json(summary)
    else:
        print(f"measured {summary['kernels']} kernels of {network.name} at batch {args.batch} "
              f"(micro-batch sizes {', '.join(map(str, summary['sizes']))}) on {summary['device']} "
              f"into {path} in {summary['seconds']:.1f} s")
    return 0


def _bench_devices(args) -> list[int] | None:
    """--devices, else $UCUDNN_BENCH_DEVICES, else GPU 0 (with --mpi: None, every GPU of the node)."""
    if args.devices:
        return args.devices
    text = os.environ.get("UCUDNN_BENCH_DEVICES", "").strip()
    if text:
        try:
            return _devices(text)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"UCUDNN_BENCH_DEVICES: {exc}") from None
    return None if args.mpi else [0]


def _bench_on_devices(kernels, settings: Settings, devices: list[int] | None, progress, args=None):
    """Several GPUs (parallel.bench_on_devices), the ranks of an MPI job (bench_with_mpi), or
    --timing other than default; the device is None at MPI ranks other than 0."""
    try:
        from .parallel import bench_on_devices, bench_with_mpi
    except ImportError:
        raise ConfigError("benchmarking on several GPUs is not in this version of ucudnn; "
                          "use one, e.g. --devices 0") from None
    path = _write_path(settings.cache_path)
    problems, sizes_for = [k.problem for k in kernels], settings.sizes_for
    timing, mpi = getattr(args, "timing", "default"), getattr(args, "mpi", None)
    if mpi:
        device = bench_with_mpi(problems, sizes_for, None, path, devices, shared=mpi == "shared",
                                progress=progress, timing=timing, execution=settings.execution)
    else:
        device = bench_on_devices(problems, sizes_for, None, path, devices, progress=progress, timing=timing,
                                  execution=settings.execution)
    return device, path


def optimize(args) -> int:
    settings = _settings(args)
    network, kernels = _kernels(args)
    if args.kernel:  # with or without --plot: a kernel not in the network is a mistake to report
        find_kernel(kernels, args.kernel)
    measured = not args.offline and _gpu_available()
    limit = settings.limit(len(kernels))
    tables, device, path = _tables(kernels, settings, limit, measured,
                                   ProgressBar({k.problem.key: k.name for k in kernels}) if measured else None,
                                   network, _request(args, settings))
    report = make_report(kernels, tables, settings)
    if args.plot:
        _plot(args, network, report, tables, settings)
    if args.json:
        _print_json({"network": network.name, "description": network.description, "batch": args.batch,
                     "dtype": args.dtype, "math": args.math, "layout": args.layout,
                     "device": _device_json(device),
                     "measured": measured, "database": str(path), **report.to_json()})
    else:
        print(_render_report(network, report, args, device, measured, path))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _plot(args, network: Network, report: Report, tables, settings: Settings) -> None:
    from .optimizers.pareto import desirable_set
    from .plots import plot_report

    row = report.row(args.kernel) if args.kernel else report.slowest()
    problem = row.kernel.problem
    front = desirable_set(tables[problem.key], problem.batch, settings.sizes(problem.batch),
                          report.limit, problem.batch_quantum())
    plot_report(report, row, front, args.plot,
              f"{network.name}, batch {args.batch}, {report.optimizer.upper()} at {format_size(report.limit)}")


def nets(args) -> int:
    if args.name is None:
        networks = list_networks()
        if args.json:
            _print_json([{"name": n.name, "description": n.description, "default_batch": n.default_batch,
                          "conv_layers": n.conv_layers, "distinct_layers": len(n.layers)} for n in networks])
        else:
            print(_table(("network", "batch", "conv layers", "distinct", "description"),
                         [(n.name, n.default_batch, n.conv_layers, len(n.layers), n.description) for n in networks]))
            print("\nbatch: the default --batch, one the shipped recording covers")
            print("also: a network file NAME.json (`ucudnn nets NAME --json` writes one) or, with torch "
                  "and torchvision installed, any torchvision model by name")
        return 0
    network = get_network(args.name)
    if args.json:
        _print_json(network.to_json())
        return 0
    print(f"{network.name}: {network.description}; {network.conv_layers} conv layers, "
          f"{len(network.layers)} distinct (n: how many have that shape)\n")
    print(_table(("layer", "n", "in", "out", "kernel", "stride", "pad", "dil", "groups", "input", "output",
                  "GFLOP/sample"),
                 [(layer.name, layer.count, layer.in_channels, layer.out_channels, _dims(layer.kernel),
                   _dims(layer.stride), _dims(layer.pad), _dims(layer.dilation), layer.groups,
                   _dims(layer.input_size), _dims(layer.output_size),
                   f"{layer.problem('F', 1).flops() / 1e9:.3f}") for layer in network.layers]))
    return 0


def _kernel_cells(problem) -> tuple:
    return (problem.kind.value, _dims(problem.x_shape[1:]), _dims(problem.w_shape), _dims(problem.pads),
            _dims(problem.strides), _dims(problem.dilations), problem.groups, problem.dtype, problem.math,
            problem.layout)


_KERNEL_HEADERS = ("kind", "input", "filter", "pad", "stride", "dil", "groups", "dtype", "math", "layout")


def cache_list(args) -> int:
    path = _read_path(args.cache)
    from .coverage import recordings

    with _database(path) as database:
        listing = [(device, database.kernels(device), recordings(database, device))
                   for device in _devices_in(database)]
    if args.json:
        _print_json({"database": str(path), "devices": [
            {**_device_json(device), "recordings": [r.to_json() for r in covered],
             "kernels": [{"shape_key": p.shape_key(), "problem": p.to_dict(), "measurements": n} for p, n in kernels]}
            for device, kernels, covered in listing]})
        return 0
    print(f"{path}: {len(listing)} recording(s), one per GPU, cuDNN version and execution")
    for device, kernels, covered in listing:
        print(f"\n{device.describe()}: {len(kernels)} kernels, {sum(n for _, n in kernels)} measurements")
        print(f"built-in networks it plans: {', '.join(r.describe() for r in covered) or 'none completely'}")
        print(_table((*_KERNEL_HEADERS, "measurements"), [(*_kernel_cells(p), n) for p, n in kernels]))
    return 0


def cache_show(args) -> int:
    network, kernels = _kernels(args)
    kernel = find_kernel(kernels, args.kernel)
    path = _read_path(args.cache)
    with _database(path) as database:
        found = [(d, database.table(kernel.problem, d)) for d in _devices_in(database)]
    found = [(device, table) for device, table in found if len(table)]
    if not found:
        raise MissingMeasurementsError(f"{path} has no measurements of {network.name} {kernel.name}; "
                                       f"measure them with `ucudnn bench --net {args.net}` on a GPU")
    ordered = lambda table: sorted(table, key=lambda m: (m.batch, m.algo))  # noqa: E731
    if args.json:
        _print_json({"kernel": kernel.name, "problem": kernel.problem.with_batch(1).to_dict(), "devices": [
            {**_device_json(device), "measurements": [asdict(m) for m in ordered(table)]}
            for device, table in found]})
        return 0
    print(f"{network.name} {kernel.name}: {kernel.problem.describe()}")
    for device, table in found:
        print(f"\n{device.describe()}")
        print(_table(("micro-batch", "algorithm", "status", "ms", "workspace", "repeats"), [
            (m.batch, algo_name(kernel.problem.kind, m.algo), m.status,
             "" if m.time_ms is None else _ms(m.time_ms), format_size(m.workspace), m.repeats)
            for m in ordered(table)]))
    return 0


def cache_merge(args) -> int:
    from .cache.database import merge

    for shard in args.shards:
        if not Path(shard).is_file():
            raise CacheError(f"shard {shard} does not exist; check the path")
    target = args.into or _target(_write_path(None))
    count = merge(args.shards, target)
    print(f"merged {count} measurements from {len(args.shards)} shard(s) into {target}")
    return 0


def cache_export(args) -> int:
    path = _read_path(args.cache)
    with _database(path) as database:
        count = database.export_json(args.file)
    print(f"exported {count} measurements from {path} to {args.file}")
    return 0


def cache_import(args) -> int:
    from .cache.database import read_export, writing

    path = _target(_write_path(args.cache))
    rows = read_export(args.file)
    with writing(path) as database:
        count = database.add_rows(*rows)
    print(f"imported {count} measurements from {args.file} into {path}")
    return 0


def cache_verify(args) -> int:
    from .errors import DamagedDatabaseError

    path = _read_path(args.cache)
    try:
        with _database(path, check=False) as database:
            problems = database.verify()
    except DamagedDatabaseError as exc:  # too damaged to open
        problems = [f"integrity: {exc.reason}"]
    for problem in problems:
        print(f"{path}: {problem}")
    if not problems:
        print(f"{path}: no problems found")
    return 1 if problems else 0


# ---- the parser


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a value such as "-1MiB" is a value (refused by its type), not an unknown option; no
        # option of ucudnn looks like a negative number
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        """One line, not the usage: the message names the value and the fix."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_FORMATTER = argparse.RawDescriptionHelpFormatter


def _parent(*options: tuple[tuple, dict]) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    for flags, kwargs in options:
        parent.add_argument(*flags, **kwargs)
    return parent


_NETWORK = _parent(
    (("--net",), dict(required=True, metavar="NAME|FILE.json",
                      help="a built-in network (see `ucudnn nets`), a network file, or a torchvision model")),
    (("--batch",), dict(type=_batch, help=(
        "mini-batch size (default: the network's, which the shipped recording covers: see `ucudnn nets`; "
        "256 for a network file or torchvision model that names none)"))),
    (("--dtype",), dict(choices=DTYPES, default="float32", help="data type (default float32)")),
    (("--math",), dict(choices=MATH_TYPES, help=(
        "cuDNN math type (default: tensor_op for float16 and bfloat16, whose tensor-core kernels "
        "need it; default for float32, which allows TF32)"))),
    (("--layout",), dict(choices=LAYOUTS, default="nchw", help="tensor layout (default nchw)")),
)
_POLICY = _parent(
    (("--policy",), dict(choices=POLICIES, help="micro-batch sizes to measure (default powerOfTwo)")),
    (("--execution",), dict(choices=EXECUTIONS, help=(
        "how kernels will run, which is how they are timed: graph (CUDA graphs, GPU time) or "
        "direct (one host call per micro-batch) (default: $UCUDNN_EXECUTION, else graph)"))),
)
_CACHE = _parent((("--cache",), dict(metavar="PATH", help=(
    "benchmark database (default: $UCUDNN_CACHE, else your cache file where ucudnn measures or writes, "
    "and the measurements shipped in cache/ where it only reads)"))))
_JSON = _parent((("--json",), dict(action="store_true", help="print one JSON document instead of text")))


def _command(commands, name: str, help: str, example: str, run, parents=()) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=help, description=help, parents=list(parents),
                                  epilog=f"example:\n  {example}", formatter_class=_FORMATTER)
    command.set_defaults(run=run)
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ucudnn", description="Micro-batched cuDNN convolutions: benchmark, plan, inspect.",
                     epilog="example:\n  ucudnn optimize --net alexnet --batch 256 --workspace 64MiB",
                     formatter_class=_FORMATTER)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(commands, "bench", "measure every kernel (F, BD, BF) of a network into the cache",
                 "ucudnn bench --net resnet50 --batch 64 --policy powerOfTwo", bench,
                 [_NETWORK, _POLICY, _CACHE, _JSON])
    p.add_argument("--devices", type=_devices, metavar="0,1", help=(
        "GPUs to measure on, one worker process each, all of one model (default: $UCUDNN_BENCH_DEVICES, "
        "else 0; with --mpi, every GPU of the node, the k-th rank of a node taking the k-th)"))
    p.add_argument("--mpi", nargs="?", const="shards", choices=("shards", "shared"), help=(
        "share the sweep among the ranks of mpirun/srun (needs mpi4py: pip install 'ucudnn[mpi]'); "
        "each rank writes a shard that rank 0 merges (shards, the default) or the database itself (shared)"))
    p.add_argument("--timing", choices=("default", "quick"), default="default", help=(
        "quick: one warm-up and at most 3 timed calls per algorithm and size, for long sweeps "
        "(default: at least 3, up to 10, filling 20 ms)"))

    p = _command(commands, "optimize", "plan micro-batches of every kernel: WR per kernel or WD for the network",
                 "ucudnn optimize --net alexnet --batch 256 --workspace 64MiB", optimize,
                 [_NETWORK, _POLICY, _CACHE, _JSON])
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="wr: a limit per kernel; wd: a total limit (default wr)")
    p.add_argument("--workspace", type=_size, metavar="SIZE", help="WR limit per kernel (default 64MiB)")
    p.add_argument("--total-workspace", type=_size, metavar="SIZE",
                   help="WD limit for the network (implies --optimizer wd; default: --workspace times the kernels)")
    p.add_argument("--plot", type=_plot_output, metavar="FILE.png",
                   help="draw a kernel's Pareto front, per-layer times and (WD) the workspace division")
    p.add_argument("--kernel", metavar="LAYER/KIND", help="the kernel --plot shows, e.g. conv2/F (default: slowest)")
    p.add_argument("--offline", action="store_true", help="plan from the cache only, even where a GPU could measure")

    cache = _command(commands, "cache", "inspect and maintain benchmark databases",
                     "ucudnn cache show --net alexnet --kernel conv2/F", None)
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    _command(actions, "list", "the GPUs and kernels a database holds", "ucudnn cache list --cache h100.db",
             cache_list, [_CACHE, _JSON])
    p = _command(actions, "show", "every measurement of one kernel", "ucudnn cache show --net alexnet "
                 "--kernel conv2/F", cache_show, [_NETWORK, _CACHE, _JSON])
    p.add_argument("--kernel", required=True, metavar="LAYER/KIND", help="e.g. conv2/F, conv2/BD, conv2/BF")
    p = _command(actions, "merge", "add shard databases into one", "ucudnn cache merge shards/*.db --into all.db",
                 cache_merge)
    p.add_argument("shards", nargs="+", metavar="SHARD.db")
    p.add_argument("--into", type=_output, metavar="PATH", help="target database (default: your cache file)")
    p = _command(actions, "export", "write a database as JSON", "ucudnn cache export h100.json --cache h100.db",
                 cache_export, [_CACHE])
    p.add_argument("file", type=_output, metavar="FILE.json")
    p = _command(actions, "import", "add a JSON export to a database", "ucudnn cache import h100.json --cache my.db",
                 cache_import, [_CACHE])
    p.add_argument("file", metavar="FILE.json")
    _command(actions, "verify", "check a database's integrity (exit 1 on problems)", "ucudnn cache verify "
             "--cache h100.db", cache_verify, [_CACHE])

    p = _command(commands, "nets", "list the built-in networks, or one network's conv layers",
                 "ucudnn nets resnet50", nets, [_JSON])
    p.add_argument("name", nargs="?", metavar="NAME|FILE.json", help="a network to show")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = args.run(args)
        sys.stdout.flush()  # short output is written here, not at exit where a broken pipe can't be caught
        return status
    except UcudnnError as exc:
        print(f"ucudnn: error: {exc}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (`ucudnn ... | head`): stop quietly, as the Python docs' "Note on
        # SIGPIPE" advises: point stdout at devnull so the flush at exit cannot fail again, and exit
        # 141 (128 + SIGPIPE), the status of a command the signal ends (cat, grep), which shells and
        # `set -o pipefail` treat as "the reader stopped early", not as an error of ours (2).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file ucudnn was told to read or write
        print(f"ucudnn: error: {exc}; check the path and its permissions", file=sys.stderr)
    return 2
