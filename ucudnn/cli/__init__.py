"""The `ucudnn` command: bench, optimize, cache, paper and nets, a thin layer over the library.

Every command parses its flags, calls the library and prints text or, with --json, one JSON
document. Errors ucudnn raises on purpose print one line and exit with status 2; its warnings
(UcudnnWarning: it carries on) print one line too, and so does each record of the `ucudnn`
logger (ucudnn.core.log: progress, plans), on stderr. The parser is
here; the commands are in `commands` and `cache_commands`, what they print in `output`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from .. import __version__
from ..core.device import EXECUTIONS, TIMING_PRESETS
from ..core.errors import UcudnnError, UcudnnWarning, install_extra
from ..core.log import logging_to_stderr
from ..core.problem import LAYOUTS, MATH_TYPES, TRAINING_DTYPES
from ..execute.backends import CHOICES as BACKEND_CHOICES
from ..measure.cache.paths import CACHE_VARIABLE
from ..optimizers.search import SEARCHES
from ..optimizers.solvers import SOLVERS
from ..paper import FIGURES
from ..plan.config import OPTIMIZERS, POLICIES
from .arguments import (
    batch_size,
    byte_size,
    cache_file,
    database_file,
    device_list,
    existing_file,
    export_file,
    output_folder,
    plot_file,
    setting,
)
from .cache_commands import cache_export, cache_import, cache_list, cache_merge, cache_prune, cache_show, cache_verify
from .commands import bench, nets, optimize, paper

SEARCH_NAMES = tuple(SEARCHES)
SOLVER_NAMES = tuple(SOLVERS)


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

# What a command stopped by Ctrl-C or SIGTERM leaves, as the line that says it stopped tells
MEASURED = "what was measured is kept in the cache, and the same command goes on from there"
READ_ONLY = "nothing was written"
IMPORT_STOPPED = ("an import is one transaction, so the database is as it was before it (a new one is removed "
                  "again) unless it had finished")
EXPORT_STOPPED = "an export is renamed into place whole, so its file is as it was unless the export had finished"
MERGE_STOPPED = ("a merge adds each shard in one transaction, so the target holds the shards added before the stop "
                 "(a new target is removed again); the same command adds the rest")
PRUNE_STOPPED = "a prune deletes in one transaction, so the database is as it was unless the prune had finished"


def _parent(*options: tuple[tuple, dict]) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    for flags, kwargs in options:
        parent.add_argument(*flags, **kwargs)
    return parent


_NETWORK = _parent(
    (("--net",), dict(required=True, metavar="NAME|FILE.json",
                      help="a built-in network (see `ucudnn nets`), a network file (`ucudnn nets --help` describes "
                           "one), or a torchvision model")),
    (("--batch",), dict(type=batch_size, help=(
        "mini-batch size (default: the network's, which the shipped recording covers: see `ucudnn nets`; "
        "256 for a network file or torchvision model that names none)"))),
    (("--dtype",), dict(choices=TRAINING_DTYPES, default="float32", help="data type (default float32)")),
    (("--math",), dict(choices=MATH_TYPES, help=(
        "cuDNN math type (default: tensor_op for float16 and bfloat16, whose tensor-core kernels "
        "need it; default for float32, which allows TF32)"))),
    (("--layout",), dict(choices=LAYOUTS, default="nchw", help="tensor layout (default nchw)")),
)
_POLICY = _parent(
    (("--policy",), dict(type=setting(POLICIES), choices=POLICIES, help=(
        "micro-batch sizes to measure (default: $UCUDNN_POLICY, else powerOfTwo)"))),
    (("--execution",), dict(type=setting(EXECUTIONS), choices=EXECUTIONS, help=(
        "how kernels will run, which is how they are timed: graph (CUDA graphs, GPU time) or "
        "direct (one host call per micro-batch) (default: $UCUDNN_EXECUTION, else graph)"))),
    (("--backend",), dict(type=setting(BACKEND_CHOICES), choices=BACKEND_CHOICES, help=(
        "where candidates come from: engines (cuDNN's graph API, nvidia-cudnn-frontend), legacy "
        "(cuDNN's legacy API) or all (default: $UCUDNN_BACKEND, else all where the frontend is "
        "installed, and all that a database holds offline)"))),
)
_CACHE = _parent((("--cache",), dict(metavar="PATH", type=cache_file, help=(
    "benchmark database, or a folder of shards: measuring uses this host's shard, reading every shard "
    "(default: $UCUDNN_CACHE, else your cache file where ucudnn measures or writes, "
    "and the measurements shipped in cache/ where it only reads)"))))
# the cache of the actions that write into one database file, which a folder of shards is not
_CACHE_FILE = _parent((("--cache",), dict(metavar="FILE.db", type=cache_file, help=(
    "the benchmark database file to write into, not a folder of shards "
    "(default: $UCUDNN_CACHE, else your cache file)"))))
_SOLVER = _parent((("--solver",), {"type": setting(SOLVER_NAMES), "choices": SOLVER_NAMES, "help": (
    f"WD's ILP solver (default: $UCUDNN_SOLVER, else the first installed of {', '.join(SOLVER_NAMES)})")}))
_JSON = _parent((("--json",), dict(action="store_true", help="print one JSON document instead of text")))


NETWORK_FILE = """

A network file NAME.json (`ucudnn nets alexnet --json` writes one) is a JSON object:
  {"name": ..., "description": ..., "default_batch": 256, "layers": [LAYER, ...]}
where "description" and "default_batch" (the --batch of commands given none) are optional, and
each LAYER is an object with
  "name", "in_channels", "out_channels", "kernel", "input_size" (of the layer's input) and optionally
  "stride" (1), "pad" (0), "dilation" (1), "groups" (1), "count" (1: how many layers have this shape),
  "transposed" (false: true for a ConvTranspose layer) and "output_padding" (0, transposed layers).
A size is an integer, or a list of 1, 2 or 3: [length], [height, width] or [depth, height, width]
(the longest list says the layer's dimensions; 2-D where all are integers). Layers of one name
have one shape: a second shape needs a name of its own."""


PAPER = """

Times are predicted (each configuration's micro-batches' measured times, summed) from the
recording in --cache, by default the H100 measurements shipped with ucudnn; --execute measures
what --cache lacks on this GPU and runs every configuration instead (give it a copy of the
shipped recording to measure only the rest). Each figure plans with cuDNN's legacy algorithms
alone (the paper's API) and with the graph-API engines too (ucudnn's default)."""


IMPORT = """

The import is one transaction: the database gets every row of the export or, where the import
fails or is stopped, none. A row of a key the database holds replaces the database's measurement
unless that one ranks higher: a result (ok, unsupported, failed) over a note of why there is none
(over_cap, out_of_memory, pruned), then default timing over quick, then the newer (recorded_at);
of rows ranked alike, the later (the export's). Two rows of one key in the export are ranked the
same way. The command says how many rows were new, replaced the database's, or were left out."""


def _command(commands, name: str, help: str, example: str, run, parents=(),
             description: str = "", stopped: str = MEASURED) -> argparse.ArgumentParser:
    """A command; `stopped` says what it leaves where Ctrl-C or SIGTERM stops it."""
    command = commands.add_parser(name, help=help, description=help + description, parents=list(parents),
                                  epilog=f"example:\n  {example}", formatter_class=_FORMATTER)
    command.set_defaults(run=run, stopped=stopped)
    return command


def _requires(parser: argparse.ArgumentParser, what: str):
    """The run of a command given none of its `what` (COMMAND, ACTION): a usage error. Checked
    after parsing, not by argparse, so that an unknown option before it is named first."""
    return lambda args: parser.error(f"the following arguments are required: {what}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ucudnn", description="Micro-batched cuDNN convolutions: benchmark, plan, inspect.",
                     epilog="example:\n  ucudnn optimize --net alexnet --batch 256 --workspace 64MiB",
                     formatter_class=_FORMATTER)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(run=_requires(parser, "COMMAND"), stopped=READ_ONLY)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _command(commands, "bench", "measure every kernel (F, BD, BF) of a network into the cache: every "
                 "candidate at every micro-batch size (a full search)",
                 "ucudnn bench --net resnet50 --batch 64 --policy powerOfTwo", bench,
                 [_NETWORK, _POLICY, _CACHE, _JSON])
    p.add_argument("--devices", type=device_list, metavar="0,1", help=(
        "GPUs to measure on, one worker process each, all of one model (default: $UCUDNN_BENCH_DEVICES, "
        "else 0; with --mpi, every GPU of the node, the k-th rank of a node taking the k-th)"))
    p.add_argument("--mpi", nargs="?", const="shards", choices=("shards", "shared"), help=(
        f"share the sweep among the ranks of mpirun/srun (needs mpi4py: {install_extra('mpi')}); "
        "each rank writes a shard that rank 0 merges (shards, the default) or the database itself (shared)"))
    p.add_argument("--timing", choices=TIMING_PRESETS, default=TIMING_PRESETS[0], help=(
        "quick: one warm-up and at most 3 timed calls per algorithm and size, for long sweeps "
        "(default: at least 3, up to 10, filling 20 ms)"))

    p = _command(commands, "optimize", "plan micro-batches of every kernel: WR per kernel or WD for the network",
                 "ucudnn optimize --net alexnet --batch 256 --workspace 64MiB", optimize,
                 [_NETWORK, _POLICY, _CACHE, _SOLVER, _JSON])
    p.add_argument("--optimizer", type=setting(OPTIMIZERS), choices=OPTIMIZERS, help=(
        "wr: a limit per kernel; wd: a total limit (default: $UCUDNN_OPTIMIZER, else wr; wd where a total is given)"))
    p.add_argument("--workspace", type=byte_size, metavar="SIZE", help=(
        "WR limit per kernel (default: $UCUDNN_WORKSPACE_LIMIT, else 64MiB)"))
    p.add_argument("--total-workspace", type=byte_size, metavar="SIZE", help=(
        "WD limit for the network (implies --optimizer wd; default: $UCUDNN_TOTAL_LIMIT, else "
        "--workspace times the kernels)"))
    p.add_argument("--plot", type=plot_file, metavar="FILE.png",
                   help="draw a kernel's Pareto front, per-layer times and (WD) the workspace division")
    p.add_argument("--kernel", metavar="LAYER/KIND", help=(
        "the kernel whose Pareto front --plot draws, e.g. conv2/F (default: the one the plan speeds up most)"))
    p.add_argument("--offline", action="store_true", help="plan from the cache only, even where a GPU could measure")
    p.add_argument("--search", type=setting(SEARCH_NAMES), choices=SEARCH_NAMES, help=(
        "what measuring on this GPU times: pruned (cuDNN's heuristic favourites within the limit, sizes "
        "down to where they stop paying) or full (every candidate at every size, as `ucudnn bench` "
        "records) (default: $UCUDNN_SEARCH, else pruned)"))

    cache = _command(commands, "cache", "inspect and maintain benchmark databases",
                     "ucudnn cache show --net alexnet --kernel conv2/F", None)
    cache.set_defaults(run=_requires(cache, "ACTION"))
    actions = cache.add_subparsers(dest="action", metavar="ACTION")
    _command(actions, "list", "the GPUs and kernels a database holds", "ucudnn cache list --cache h100.db",
             cache_list, [_CACHE, _JSON], stopped=READ_ONLY)
    p = _command(actions, "show", "every measurement of one kernel", "ucudnn cache show --net alexnet "
                 "--kernel conv2/F", cache_show, [_NETWORK, _CACHE, _JSON], stopped=READ_ONLY)
    p.add_argument("--kernel", required=True, metavar="LAYER/KIND", help="e.g. conv2/F, conv2/BD, conv2/BF")
    p = _command(actions, "merge", "add shard databases into one", "ucudnn cache merge shards/*.db --into all.db",
                 cache_merge, stopped=MERGE_STOPPED)
    p.add_argument("shards", nargs="+", metavar="SHARD.db", help="shard databases, or folders of them (every *.db)")
    p.add_argument("--into", type=database_file, metavar="PATH", help="target database (default: your cache file)")
    p = _command(actions, "export", "write a database as JSON", "ucudnn cache export h100.json --cache h100.db",
                 cache_export, [_CACHE], stopped=EXPORT_STOPPED)
    p.add_argument("file", type=export_file, metavar="FILE.json", help=(
        "the JSON file to write, a new one unless --force; - for standard output. A database, the one "
        "exported above all, is never replaced"))
    p.add_argument("--force", action="store_true", help="replace FILE.json where it exists (never a database)")
    p = _command(actions, "import", "add a JSON export to a database", "ucudnn cache import h100.json --cache my.db",
                 cache_import, [_CACHE_FILE], description=IMPORT, stopped=IMPORT_STOPPED)
    p.add_argument("file", type=existing_file("export"), metavar="FILE.json",
                   help="a file `ucudnn cache export` wrote")
    _command(actions, "prune", "keep only the measurements plans can use (a smaller file, the same plans)",
             "ucudnn cache prune --cache shared.db", cache_prune, [_CACHE_FILE], stopped=PRUNE_STOPPED)
    p = _command(actions, "verify", "check a database's integrity (exit 1 on problems)", "ucudnn cache verify "
                 "--cache h100.db", cache_verify, [_CACHE], stopped=READ_ONLY)
    p.add_argument("--details", action="store_true", help=(
        "each problem SQLite's integrity check reports, a line each (default: how many, and the first)"))

    p = _command(commands, "paper", "the paper's evaluation figure by figure: each figure's numbers now beside "
                 "the paper's, as a Markdown page and a PNG", "ucudnn paper 10 --out docs/paper", paper,
                 [_CACHE, _SOLVER],
                 description=PAPER)
    p.add_argument("figure", choices=(*FIGURES, "all"), metavar="FIG", help=(
        f"a figure of the paper's section IV ({', '.join(FIGURES)}), or all of them and the index README.md"))
    p.add_argument("--out", type=output_folder, default="docs/paper", metavar="FOLDER", help=(
        "where to write figFIG.md and figFIG.png (made where missing; default docs/paper)"))
    p.add_argument("--execute", action="store_true", help=(
        "measure on this GPU what the cache lacks and run every configuration, as the paper did, into "
        "figFIG-executed.md and .png (default: predicted from recorded measurements, no GPU needed)"))
    p.add_argument("--no-measure", dest="measure", action="store_false", help=(
        "with --execute: measure nothing, plan from what the cache holds for this GPU (fill it first with "
        "`ucudnn bench --devices 0,1,...` on several GPUs at once); a plan it lacks is left out and named"))

    p = _command(commands, "nets", "list the built-in networks, or one network's conv layers",
                 "ucudnn nets resnet50", nets, [_JSON], description=NETWORK_FILE, stopped=READ_ONLY)
    p.add_argument("name", nargs="?", metavar="NAME|FILE.json", help="a network to show")
    return parser


def _one_line(show):
    """`warnings.showwarning` that prints a UcudnnWarning as its message alone, others as `show` does."""
    def shown(message, category, *where, **options) -> None:
        if issubclass(category, UcudnnWarning):
            print(message, file=sys.stderr)
        else:
            show(message, category, *where, **options)
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings(), logging_to_stderr():
        warnings.showwarning = _one_line(warnings.showwarning)
        return _run(args)


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def _stopped_by_sigterm():
    """SIGTERM (`timeout`, a batch scheduler's time limit) raises Stopped in the main thread, so
    that a command's `finally` blocks run as they do for Ctrl-C: a sweep stops its workers and
    merges what they measured (docs/parallel.md). Python's default for SIGTERM ends the process
    with none of them run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped()
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
    try:
        with _stopped_by_sigterm():
            status = args.run(args)
        sys.stdout.flush()  # short output is written here, not at exit where a broken pipe can't be caught
        return status
    except KeyboardInterrupt as exc:
        # the shell's status of a command a signal ends: 128 + SIGTERM (15) or SIGINT (2)
        print(f"ucudnn: stopped by {'SIGTERM' if isinstance(exc, Stopped) else 'Ctrl-C'}; {args.stopped}",
              file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Stopped) else signal.SIGINT)
    except UcudnnError as exc:
        print(f"ucudnn: error: {_with_origin(str(exc), args)}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (`ucudnn ... | head`): stop quietly, as the Python docs' "Note on
        # SIGPIPE" advises: point stdout at devnull so the flush at exit cannot fail again, and exit
        # 141 (128 + SIGPIPE), the status of a command the signal ends (cat, grep), which shells and
        # `set -o pipefail` treat as "the reader stopped early", not as an error of ours (2).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file ucudnn was told to read or write
        print(f"ucudnn: error: {_with_origin(str(exc), args)}; check the path and its permissions", file=sys.stderr)
    return 2


def _with_origin(message: str, args) -> str:
    """`message`, naming UCUDNN_CACHE where the database path it speaks of came from it (no
    --cache given): the settings' variables are named where they are read (config.Settings.load)."""
    path = os.environ.get(CACHE_VARIABLE)
    if path and getattr(args, "cache", None) is None and path in message:
        return f"{message} ({CACHE_VARIABLE}={path})"
    return message
