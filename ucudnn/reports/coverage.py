"""What a benchmark database covers: the networks, mini-batch sizes, data types, layouts and
micro-batch policies it can plan without a GPU, derived from the measurements it holds."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.device import Provenance
from ..core.errors import MissingMeasurementsError
from ..core.measurements import KernelTable, describe_sizes
from ..core.nets import Network, list_networks
from ..core.problem import ConvKind, default_math
from ..execute.backends import BACKENDS
from ..optimizers.search import FULL
from ..plan.config import batch_sizes

POLICY_ORDER = ("all", "powerOfTwo")  # the first one a recording satisfies describes it


def describe_variant(dtype: str, layout: str, math: str) -> str:
    """'float32 nchw', with the math type where it is not the dtype's default: 'float32 nchw math fma'."""
    return f"{dtype} {layout}" + ("" if math == default_math(dtype) else f" math {math}")


@dataclass(frozen=True)
class Recording:
    """A network measured at every micro-batch size `policy` needs up to `batch`, on one device:
    with "all", any batch up to `batch` plans offline; with "powerOfTwo", `batch` and the powers
    of two below it."""

    network: str
    batch: int
    dtype: str
    layout: str
    math: str
    policy: str

    def covers(self, batch: int, policy: str) -> bool:
        if self.policy == "all":
            return batch <= self.batch
        return batch <= self.batch and batch & (batch - 1) == 0 and policy != "all"

    def describe(self) -> str:
        sizes = f"any batch up to {self.batch}" if self.policy == "all" else f"batch {self.batch}"
        return f"{self.network} {sizes} {describe_variant(self.dtype, self.layout, self.math)} ({self.policy})"

    def to_json(self) -> dict:
        return {"network": self.network, "batch": self.batch, "dtype": self.dtype, "layout": self.layout,
                "math": self.math, "policy": self.policy}


def _variants(database, device: Provenance) -> list[tuple[str, str, str]]:
    """The (dtype, layout, math) combinations the database has any kernel of on `device`."""
    return sorted({(p.dtype, p.layout, p.math) for p, _ in database.kernels(device)})


def _measured_sizes(database, device: Provenance, network: Network, variant: tuple[str, str, str],
                    backend: str | None) -> tuple[set[int], set[int]]:
    """The micro-batch sizes at which every kernel of `network` is completely measured (by the
    candidates of `backend`; None: of every backend together): as whole calls, and as parts of
    a mini-batch (backward-filter parts of sums, ucudnn.core.accumulation; whole calls otherwise)."""
    dtype, layout, math = variant
    problems = network.problems(1, dtype, math, layout)
    found = database.lookup([k.problem.shape_key() for k in problems], device)
    whole, parts = [], []
    for kernel in problems:
        shape = found[kernel.problem.shape_key()]
        summed = kernel.problem.kind is ConvKind.BACKWARD_FILTER
        as_whole, as_part = (_complete(shape.summed(flavour), backend) for flavour in (False, summed))
        whole.append(as_whole | as_part)  # a part stands in for the whole call (ShapeTable.for_kernel)
        parts.append(as_part)
    return (set.intersection(*whole), set.intersection(*parts)) if whole else (set(), set())


def _complete(table: KernelTable, backend: str | None) -> set[int]:
    """The sizes a full search measured completely (a pruned search's PRUNED rows make a size
    partial: ucudnn.optimizers.search)."""
    table = table.only(BACKENDS if backend is None else [backend])
    return {b for b in table.sizes if FULL.complete_at(table, b, None)}


def _largest(sizes: tuple[set[int], set[int]], policy: str) -> int | None:
    """The largest mini-batch measured whole whose smaller `policy` micro-batch sizes are all
    measured as parts."""
    whole, parts = sizes
    fitting = [b for b in whole if parts.issuperset(set(batch_sizes(policy, b)) - {b})]
    return max(fitting, default=None)


def _recording(network: Network, variant: tuple[str, str, str], sizes: tuple[set[int], set[int]]) -> Recording | None:
    batch = _largest(sizes, "powerOfTwo")
    if batch is None:
        return None
    policy = next(p for p in POLICY_ORDER if _largest(sizes, p) == batch)
    return Recording(network.name, batch, *variant, policy)


def recordings(database, device: Provenance, networks: Sequence[Network] | None = None,
               backend: str | None = None) -> list[Recording]:
    """What `database` (a BenchmarkDatabase) can plan on `device`'s GPU, cuDNN and execution: for
    each network (default: the built-in ones) and data type, layout and math type it holds, the
    largest mini-batch it covers, with the candidates of `backend` alone (None: of all)."""
    found = []
    for variant in _variants(database, device):
        for network in networks if networks is not None else list_networks():
            recording = _recording(network, variant, _measured_sizes(database, device, network, variant, backend))
            if recording:
                found.append(recording)
    return found


def recordings_by_backend(database, device: Provenance,
                          networks: Sequence[Network] | None = None) -> dict[str, list[Recording]]:
    """recordings() of each backend's candidates alone, by backend name (every backend listed)."""
    return {backend: recordings(database, device, networks, backend) for backend in BACKENDS}


def describe_by_backend(by_backend: dict[str, list[Recording]]) -> str:
    """'legacy: alexnet batch 256 float32 nchw (powerOfTwo); engines: none'."""
    return "; ".join(f"{backend}: {', '.join(r.describe() for r in found) or 'none'}"
                     for backend, found in by_backend.items())


@dataclass(frozen=True)
class Request:
    """What a command was asked to plan; `net` as the user named it (a name or a network file)."""

    net: str
    batch: int
    dtype: str = "float32"
    layout: str = "nchw"
    math: str = "default"
    policy: str = "powerOfTwo"
    backends: tuple[str, ...] = BACKENDS  # whose candidates the plan may use (Settings.backends)

    def covered_by(self, recording: Recording) -> bool:
        """Whether `recording` (of this request's network) has every measurement it needs."""
        return ((recording.dtype, recording.layout, recording.math) == (self.dtype, self.layout, self.math)
                and recording.covers(self.batch, self.policy))

    def describe(self, what: str) -> str:
        """'alexnet at batch 256 float32 nchw math fma': `what` (the network, one of its kernels)
        as this asks for it."""
        return f"{what} at batch {self.batch} {describe_variant(self.dtype, self.layout, self.math)}"

    def missing_backends(self, by_backend: dict[str, list[Recording]]) -> list[str]:
        """The backends of this request whose recordings do not cover it."""
        return [b for b in self.backends if not any(self.covered_by(r) for r in by_backend.get(b, ()))]

    def bench_command(self, backend: str | None = None) -> str:
        """The `ucudnn bench` command that measures what planning this needs (defaults left out),
        with `--backend` where one `backend` alone lacks it."""
        defaults = Request(self.net, self.batch, math=default_math(self.dtype))
        flags = [f"--{name} {getattr(self, name)}" for name in ("dtype", "layout", "math", "policy")
                 if getattr(self, name) != getattr(defaults, name)]
        flags += [f"--backend {backend}"] if backend else []
        return " ".join(["ucudnn bench --net", self.net, "--batch", str(self.batch), *flags])


def explain_missing(error: MissingMeasurementsError, database, device: Provenance, network: Network,
                    request: Request) -> MissingMeasurementsError:
    """`error` of a plan from `database` alone, retold: what it lacks, what of `network` it has,
    and the command that measures the rest."""
    lacking = (f": {error.problem.describe()} at {describe_sizes(error.missing)}" if error.problem else "")
    by_backend = recordings_by_backend(database, device, [network])
    has = (describe_by_backend(by_backend) if any(by_backend.values()) else
           f"no complete recording of {network.name} (`ucudnn cache list` lists what it has)")
    missing = request.missing_backends(by_backend)
    command = request.bench_command(missing[0] if len(missing) == 1 else None)
    return MissingMeasurementsError(
        f"{database.path} has no measurements for {request.describe(network.name)} ({request.policy}) on "
        f"{device.describe()}{lacking}; it has {has}; measure them "
        f"with `{command}` on a GPU, or point --cache at a database that has them",
        problem=error.problem, missing=error.missing)
