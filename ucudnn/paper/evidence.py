"""Where the numbers of the paper's figures come from now (ucudnn.paper). Both kinds of evidence
plan as `ucudnn optimize` plans (the same tables, solve and report); they differ in where the
measurements come from and what a configuration's time is. `Predicted` reads a recording (the
shipped one unless the settings name another database) and sums a configuration's measured
micro-batches; `Executed` measures on this GPU what its cache lacks and runs every configuration
as the handle runs it (benchmark.ConfigurationTimer), as the paper executed its figures."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..core.device import Provenance
from ..core.errors import ConfigError, GpuUnavailableError, MissingMeasurementsError
from ..core.measurements import KernelTable
from ..core.nets import Network
from ..core.problem import ConvProblem, Kernel
from ..core.progress import Progress as Line, counted
from ..measure.cache import Cache, cache_path
from ..measure.cache.database import BenchmarkDatabase
from ..optimizers import DIVIDING, PER_KERNEL
from ..optimizers.configuration import Configuration
from ..plan.config import Settings, format_size
from ..plan.solve import Measure, plan
from ..plan.sources import Progress, complete_tables, device_with_most, gpu_available, open_database
from ..reports.coverage import Request
from ..reports.report import Report, make_report

# Whose candidates a figure plans with: cuDNN's legacy algorithms alone (the API the paper's cuDNN
# 6 and 7 had), or those and cuDNN's graph-API engines (ucudnn's default); drawings show the last
CANDIDATES = {"legacy": "legacy algorithms", "all": "legacy algorithms and engines"}
DRAWN = "all"
NEEDS_GPU = ("`ucudnn paper --execute` runs the figures' convolutions on an NVIDIA GPU with cuDNN and none is "
             "usable here; leave --execute out for the figures predicted from the shipped measurements")


class Evidence:
    """What both kinds share: settings of a figure's variants, plans (made once: figures share
    them) and the times of a plan by layer; `close()` (or a with block) releases the measurements."""

    label = ""  # its word in pages: "ms (predicted)"
    executed = False
    device: Provenance | None = None  # of the measurements used last
    database: Path
    source: BenchmarkDatabase | Cache  # the measurements

    def __init__(self, settings: Settings | None):
        self.base = settings or Settings.load()
        self._reports: dict[tuple, Report] = {}
        self.line = Line(self.base.progress)  # the progress line of long work: a step at each plan made
        self.stage = ""  # what is done so far, as the line says it (write_figures: the figures)

    @property
    def flags(self) -> str:
        """The command's flags that choose it: `ucudnn paper FIG{flags}`."""
        return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    def settings(self, candidates: str, policy: str, workspace: int = 0, total: int | None = None) -> Settings:
        """The base settings planning `candidates` (CANDIDATES) with `policy`: WR at `workspace`
        bytes per kernel, or WD dividing `total`."""
        optimizer = PER_KERNEL if total is None else DIVIDING
        return replace(self.base, backend=candidates, policy=policy, workspace_limit=workspace, total_limit=total,
                       optimizer=optimizer.name)

    def measure(self, settings: Settings) -> Measure:
        """The measuring step of a plan at `settings` (solve.plan)."""
        raise NotImplementedError

    def report(self, kernels: Sequence[Kernel], settings: Settings) -> Report:
        """`kernels` planned as `ucudnn optimize` plans them."""
        key = (tuple(kernels), settings)
        if key not in self._reports:
            self.line.step(f"{counted(len(kernels), 'kernel')}, {settings.optimizing.label} at "
                           f"{format_size(settings.limit(len(kernels)))}, {settings.policy}, "
                           f"{CANDIDATES.get(settings.backend, settings.backend)}", self.stage)
            self._reports[key] = make_report(plan(kernels, settings, self.measure(settings)), settings)
            self.line.finished()
        return self._reports[key]

    def recorded(self, network: Network, batch: int, settings: Settings, missing: list[str]) -> Report | None:
        """`network` at `batch` planned at `settings`; where the measurements lack it, None, and the
        `ucudnn bench` command that measures it added to `missing`."""
        try:
            return self.report(network.problems(batch), settings)
        except MissingMeasurementsError:
            command = Request(network.name, batch, policy=settings.policy).bench_command()
            missing += [] if command in missing else [command]
            return None

    def time_ms(self, kernel: Kernel, configuration: Configuration) -> float:
        """One run of `configuration` on `kernel`."""
        raise NotImplementedError

    def total_ms(self, report: Report, which: str = "configuration") -> float:
        """Every kernel of `report` once per occurrence: its plan, or the "undivided" or "best" reference."""
        return sum(self.layer_ms(report, which).values())

    def layer_ms(self, report: Report, which: str = "configuration") -> dict[str, float]:
        """Milliseconds per layer (its kernels, every occurrence) of the plan or a reference."""
        times: dict[str, float] = {}
        for row in report.rows:
            ms = row.kernel.count * self.time_ms(row.kernel, getattr(row, which))
            times[row.kernel.layer] = times.get(row.kernel.layer, 0.0) + ms
        return times

    def torch_workspace(self, kernel: Kernel) -> int | None:
        """Bytes torch's own convolution of `kernel` takes for its workspace; None: not known here."""
        return None

    def describe(self) -> str:
        """Where the numbers come from, as a clause."""
        raise NotImplementedError

    def timing(self) -> str:
        """What a configuration's time is, as a clause."""
        raise NotImplementedError


class Predicted(Evidence):
    """Measurements from a database's recording; a configuration's time is their sum."""

    label = "predicted"
    source: BenchmarkDatabase  # the recording

    def __init__(self, settings: Settings | None = None):
        super().__init__(settings)
        self.source = open_database(cache_path(self.base.cache_path, readonly=True))
        self.database = Path(self.source.path)
        self._devices: dict[tuple[str, ...], Provenance] = {}

    def measure(self, settings: Settings) -> Measure:
        def measure(problems: Sequence[ConvProblem], cap: int | None) -> dict[str, KernelTable]:
            key = tuple(p.key for p in problems)
            if key not in self._devices:  # the recording's GPU with the most of them, as sources.tables_for picks
                self._devices[key] = device_with_most(self.source, problems, settings.execution)
            self.device = self._devices[key]
            return complete_tables(problems, settings, cap, self.source, None, device=self.device)
        return measure

    def time_ms(self, kernel: Kernel, configuration: Configuration) -> float:
        return configuration.time_ms

    def describe(self) -> str:
        device = self.device.describe() if self.device else "the recording's GPU"
        return f"predicted from measurements recorded on {device} ({self.database.name})"

    def timing(self) -> str:
        return "a configuration's time is the sum of its micro-batches' measured times"


class Executed(Evidence):
    """Measurements taken on this GPU into the settings' cache where it lacks them, by a full
    search (every candidate at every size, as the paper's WR benchmarks and as `ucudnn bench`
    recorded the shipped file), and every configuration executed as the handle runs it (median of
    timed runs). With `measure_missing` False nothing is measured: plans come from what the cache
    holds for this GPU (filled first by `ucudnn bench`, on several GPUs at once), and a plan it
    lacks is left out, as a predicted figure leaves out what the recording lacks. `benchmarker`
    and `timer` stand in for the GPU's (tests); `progress` hears of each kernel measured
    (sources.Progress: the CLI's bar)."""

    label = "executed"
    executed = True
    device: Provenance  # this GPU
    source: Cache  # the settings' database, filled here

    def __init__(self, settings: Settings | None = None, benchmarker=None, timer=None,
                 progress: Progress | None = None, measure_missing: bool = True):
        super().__init__(replace(settings or Settings.load(), search="full"))
        if benchmarker is None or timer is None:
            if not gpu_available():
                raise GpuUnavailableError(NEEDS_GPU)
            from ..measure.benchmark import ConfigurationTimer, CudnnBenchmarker

            benchmarker = CudnnBenchmarker(execution=self.base.execution, backend="all")
            timer = ConfigurationTimer(benchmarker.handle, stream=benchmarker.stream,
                                       execution=self.base.execution, backend="all")
        self.benchmarker, self.timer, self.progress = benchmarker, timer, progress
        self.measure_missing = measure_missing
        self.source = Cache(self.base.cache_path)
        assert self.source.path is not None  # a Cache with its file
        self.device, self.database = benchmarker.device, self.source.path
        self._times: dict[tuple[str, Configuration], float] = {}

    @property
    def flags(self) -> str:
        return " --execute" + ("" if self.measure_missing else " --no-measure")

    def measure(self, settings: Settings) -> Measure:
        if not self.measure_missing:
            return lambda problems, cap: complete_tables(problems, settings, cap, self.source, None, device=self.device)
        return lambda problems, cap: complete_tables(problems, settings, cap, self.source, self.benchmarker,
                                                     self.progress)

    def time_ms(self, kernel: Kernel, configuration: Configuration) -> float:
        key = (kernel.problem.key, configuration)
        if key not in self._times:
            self._times[key] = self.timer.time_ms(kernel.problem, configuration)
        return self._times[key]

    def torch_workspace(self, kernel: Kernel) -> int | None:
        """What torch's own convolution allocates beyond its result, cudnn.benchmark on, memory free
        (ucudnn.torch times it so to decide delegation)."""
        try:
            import torch

            from ..integrations.torch.kernels import TorchFramework
        except ImportError:
            raise ConfigError("Fig. 12 measures torch's own workspace and torch is not installed: "
                              "pip install torch (with CUDA)") from None
        torch.backends.cudnn.benchmark = True
        return TorchFramework().time_own(kernel.problem, torch.device("cuda")).workspace

    def describe(self) -> str:
        taken = "measurements in" if self.measure_missing else "planned from the measurements, none taken here, in"
        return f"executed on {self.device.describe()} ({taken} {self.database})"

    def timing(self) -> str:
        return "a configuration's time is the median of timed runs of it as the handle runs it"
