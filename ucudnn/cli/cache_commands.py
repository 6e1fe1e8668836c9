"""`ucudnn cache ...`: list, show, merge, export, import, prune and verify benchmark databases."""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from ..core.errors import CacheError, DamagedDatabaseError, MissingMeasurementsError
from ..core.nets import find_kernel
from ..measure.cache.interchange import read_export
from ..measure.cache.merging import merge, writing
from ..measure.cache.paths import cache_path
from ..measure.cache.schema import UPGRADE, ForeignFileError, NewerSchemaError
from ..plan.config import format_size
from ..plan.sources import devices_in, open_database, shards_in
from ..reports.coverage import describe_by_backend, recordings, recordings_by_backend
from .arguments import STDOUT, target
from .commands import kernels_of, request_of
from .output import device_json, dims, ms, print_json, table

_KERNEL_HEADERS = ("kind", "input", "filter", "pad", "stride", "dil", "groups", "dtype", "math", "layout")


def _kernel_cells(problem) -> tuple:
    return (problem.kind.value, dims(problem.x_shape[1:]), dims(problem.w_shape), dims(problem.pads),
            dims(problem.strides), dims(problem.dilations), problem.groups, problem.dtype, problem.math,
            problem.layout)


def cache_list(args) -> int:
    path = cache_path(args.cache, readonly=True)
    with open_database(path) as database:
        listing = [(device, database.kernels(device), recordings(database, device),
                    recordings_by_backend(database, device)) for device in devices_in(database)]
    if args.json:
        print_json({"database": str(path), "devices": [
            {**device_json(device), "recordings": [r.to_json() for r in covered],
             "recordings_by_backend": {b: [r.to_json() for r in found] for b, found in by_backend.items()},
             "kernels": [{"shape_key": p.shape_key(), "problem": p.to_dict(), "measurements": n} for p, n in kernels]}
            for device, kernels, covered, by_backend in listing]})
        return 0
    print(f"{path}: {len(listing)} recording(s), one per GPU, cuDNN version and execution")
    for device, kernels, covered, by_backend in listing:
        print(f"\n{device.describe()}: {len(kernels)} kernels, {sum(n for _, n in kernels)} measurements")
        print(f"built-in networks it plans: {', '.join(r.describe() for r in covered) or 'none completely'}")
        print(f"by backend: {describe_by_backend(by_backend)}")
        print(table((*_KERNEL_HEADERS, "measurements"), [(*_kernel_cells(p), n) for p, n in kernels]))
    return 0


def cache_show(args) -> int:
    network, kernels = kernels_of(args)
    kernel = find_kernel(kernels, args.kernel)
    path = cache_path(args.cache, readonly=True)
    with open_database(path) as database:
        found = [(d, database.table(kernel.problem, d)) for d in devices_in(database)]
    found = [(device, measured) for device, measured in found if len(measured)]
    if not found:
        request = request_of(args)
        asked = request.describe(f"{network.name} {kernel.name}")
        raise MissingMeasurementsError(f"{path} has no measurements of {asked}; measure them with "
                                       f"`{request.bench_command()}` on a GPU")
    ordered = lambda measured: sorted(measured, key=lambda m: (m.batch, m.algo))  # noqa: E731
    if args.json:
        print_json({"kernel": kernel.name, "problem": kernel.problem.with_batch(1).to_dict(), "devices": [
            {**device_json(device), "measurements": [asdict(m) for m in ordered(measured)]}
            for device, measured in found]})
        return 0
    print(f"{network.name} {kernel.name}: {kernel.problem.describe()}")
    for device, measured in found:
        print(f"\n{device.describe()}")
        print(table(("micro-batch", "algorithm", "status", "ms", "workspace", "repeats"), [
            (m.batch, m.algo, m.status,
             "" if m.time_ms is None else ms(m.time_ms), format_size(m.workspace), m.repeats)
            for m in ordered(measured)]))
    return 0


def _shard_files(shard: str) -> list[Path]:
    """A shard given to merge: a file, or a shard folder's files."""
    if Path(shard).is_dir():
        return shards_in(shard)
    if not Path(shard).is_file():
        raise CacheError(f"shard {shard} does not exist; check the path")
    return [Path(shard)]


def cache_merge(args) -> int:
    shards = [file for shard in args.shards for file in _shard_files(shard)]
    into = args.into or target(cache_path())
    count = merge(shards, into)
    print(f"merged {count} measurements from {len(shards)} shard(s) into {into}")
    return 0


def cache_export(args) -> int:
    """The export on standard output (`-`) is all that is printed there."""
    path = cache_path(args.cache, readonly=True)
    with open_database(path) as database:
        count = database.export_json(sys.stdout if args.file == STDOUT else args.file, force=args.force)
    if args.file != STDOUT:
        print(f"exported {count} measurements from {path} to {args.file}")
    return 0


def cache_import(args) -> int:
    path = target(cache_path(args.cache))
    try:
        rows = read_export(args.file)
    except NewerSchemaError as exc:  # said of a database; this is an export
        raise CacheError(f"export {args.file} has schema version {exc.found}, newer than this ucudnn reads: "
                         f"upgrade ucudnn ({UPGRADE}), or export the database again with this one") from None
    with writing(path) as database:
        added = database.add_rows(*rows)
    print(f"imported {added.written} of the {added.rows} measurements of {args.file} into {path}: "
          f"{added.describe()}")
    return 0


def cache_prune(args) -> int:
    path = cache_path(args.cache)
    if path.is_dir():
        raise CacheError(f"{path} is a shard folder; name one database file to prune, e.g. "
                         f"--cache {shards_in(path)[0]}")
    if not path.is_file():
        raise CacheError(f"{path} does not exist; name the database to prune with --cache")
    with writing(path) as database:
        before, after = database.prune()
    print(f"pruned {path}: kept {after} of {before} measurements, those plans can use "
          "(each size's time-workspace front per kernel and backend)")
    return 0


def _verify(path, details: bool) -> list[str]:
    """The problems of one database file, each after the file's name (BenchmarkDatabase.verify)."""
    try:
        with open_database(path, check=False) as database:
            problems = database.verify(details)
    except DamagedDatabaseError as exc:  # too damaged to open
        problems = [f"integrity: {exc.reason}"]
    except ForeignFileError as exc:
        problems = [f"not a ucudnn benchmark database ({exc.reason})"]
    return [f"{path}: {problem}" for problem in problems]


def cache_verify(args) -> int:
    path = cache_path(args.cache, readonly=True)
    folder = path is not None and path.is_dir()
    files = shards_in(path) if folder and path is not None else [path]
    problems = [problem for file in files for problem in _verify(file, args.details)]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{path}: no problems found" + (f" in {len(files)} shard(s)" if folder else ""))
    return 1 if problems else 0
