"""The engines backend: cuDNN's graph API through nvidia-cudnn-frontend (module `cudnn`).

Each micro-batch kernel is one frontend graph. Its candidates are every engine configuration
that heuristics modes A, B and FALLBACK list, in their order, without those the numerics forbid,
named by engine id and knobs (`get_plan_name_at_index`). Listing a candidate's workspace needs its
plan built, the costly part of a sweep, so plans are built one by one as asked for: a
handle builds only the plans it runs, a pruned search (ucudnn.optimizers.search) only those it may time, and
the benchmarker drops the graphs of each kernel it has measured (`release`). Plans are built in line:
on threads, a handle each, building is slower (docs/results-archive.md, "The engine backend's remaining bars").
"""
from __future__ import annotations

from ...core.accuracy import accurate
from ...core.errors import BackendUnavailableError, CandidateError, gpu_install
from ...core.measurements import FAILED, OK, UNSUPPORTED
from ...core.problem import ConvKind, ConvProblem
from .. import gpu
from ..bindings import cudnn as bindings, library
from ..dispatch import OUTPUT, Plan, Step
from .base import Candidate, candidate_id, split_id

NAME = "engines"
# An engines task costs this many legacy tasks of the same flops: an engine sweep times about
# this many times as many candidates per (kernel, size) as legacy lists algorithms (at most 8),
# each a plan built, then timed coarse (docs/results.md, "The engine backend: against what
# PyTorch users run", its AlexNet sweep). Only the balance of GPUs' shares depends on it.
TASK_WEIGHT = 4
NO_CANDIDATE = candidate_id(NAME, "none")  # recorded where the graph API has no plan at all


def install() -> str:
    """How to install the frontend: with a GPU extra, which picks the release that fits its CUDA."""
    return f"a GPU extra installs it: {gpu_install()}"


def frontend():
    try:
        import cudnn
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend 'engines' needs nvidia-cudnn-frontend, which does not import here ({exc}): "
            f"{install()}; or set backend='legacy' (UCUDNN_BACKEND=legacy)") from exc
    return cudnn


def strides(shape: tuple[int, ...], layout: str) -> list[int]:
    """Element strides of a packed (N, C, *spatial) tensor stored as `layout`."""
    order = list(range(len(shape))) if layout == "nchw" else [0, *range(2, len(shape)), 1]
    result, step = [0] * len(shape), 1
    for axis in reversed(order):
        result[axis], step = step, step * shape[axis]
    return result


def enum(fe, name: str):
    """A frontend enum (heur_mode, numerical_note, ...): exported by `cudnn`, or only by its
    compiled module in some releases."""
    found = getattr(fe, name, None) or getattr(getattr(fe, "_compiled_module", None), name, None)
    if found is None:
        raise BackendUnavailableError(f"nvidia-cudnn-frontend {fe.__file__} has no {name}; {install()}")
    return found


def excluded_notes(fe, problem: ConvProblem) -> list:
    """Numerical notes a candidate must not carry under the kernel's numerics: `fma` forbids
    tensor cores (no TF32), only `tensor_op_allow_conversion` allows down-converting inputs, and
    a deterministic kernel forbids engines cuDNN notes NONDETERMINISTIC. (REDUCED_PRECISION_REDUCTION
    is too coarse to act on: ucudnn.core.accuracy says why.) Deselected plans stay
    listed but fail to build, so they are recorded FAILED: never timed, never chosen."""
    note = enum(fe, "numerical_note")
    notes = []
    if problem.math == "fma":
        notes.append(note.TENSOR_CORE)
    if problem.math != "tensor_op_allow_conversion":
        notes.append(note.DOWN_CONVERT_INPUTS)
    if problem.deterministic:
        notes.append(note.NONDETERMINISTIC)
    return notes


class KernelGraph:
    """One micro-batch kernel as a frontend graph: its candidates by name, plans built on demand.
    `sm_count`: the streaming multiprocessors its engines may use (cuDNN's SM carveout, Hopper and
    later: heuristics list only engines that keep to it); None, all of them."""

    def __init__(self, fe, problem: ConvProblem, handle: int, sm_count: int | None = None):
        self.fe, self.problem, self.handle, self.sm_count = fe, problem, handle, sm_count
        self.graph, self.uids = self._make()
        self.index: dict[str, int] = {}
        self.built: dict[str, int | str] = {}  # name -> workspace bytes, or why it failed
        try:
            mode = enum(fe, "heur_mode")
            self.graph.create_execution_plans([mode.A, mode.B, mode.FALLBACK])
            notes = excluded_notes(fe, problem)
            if notes:
                self.graph.deselect_numeric_notes(notes)
            self.graph.check_support()
        except BackendUnavailableError:
            raise
        except Exception:  # cuDNN supports this graph with no engine (left): no candidates
            return
        for i in range(self.graph.get_execution_plan_count()):
            try:
                self.index.setdefault(self.graph.get_plan_name_at_index(i), i)
            except Exception:
                continue

    def _make(self):
        fe, p = self.fe, self.problem
        io, compute = _data_type(fe, p.dtype), _data_type(fe, p.compute_type)
        graph = fe.pygraph(io_data_type=io, intermediate_data_type=compute, compute_data_type=compute,
                           handle=self.handle, **({} if self.sm_count is None else {"sm_count": self.sm_count}))
        shapes = {"x": p.x_shape, "w": p.w_shape, "y": p.y_shape}
        tensor = {role: graph.tensor(name=role, dim=list(shape), stride=strides(shape, p.layout), data_type=io)
                  for role, shape in shapes.items() if role != OUTPUT[p.kind]}
        conv = dict(padding=list(p.pads), stride=list(p.strides), dilation=list(p.dilations),
                    compute_data_type=compute)
        if p.mode == "convolution":  # the default is cross-correlation
            conv["convolution_mode"] = enum(fe, "convolution_mode").CONVOLUTION
        if p.kind is ConvKind.FORWARD:
            out = graph.conv_fprop(image=tensor["x"], weight=tensor["w"], **conv)
        elif p.kind is ConvKind.BACKWARD_DATA:
            out = graph.conv_dgrad(loss=tensor["y"], filter=tensor["w"], **conv)
        else:
            out = graph.conv_wgrad(image=tensor["x"], loss=tensor["y"], **conv)
        role = OUTPUT[p.kind]
        out.set_output(True).set_dim(list(shapes[role])).set_stride(strides(shapes[role], p.layout)).set_data_type(io)
        tensor[role] = out
        graph.validate()
        graph.build_operation_graph()
        return graph, {role: t.get_uid() for role, t in tensor.items()}

    def build(self, name: str) -> int | str:
        """The plan's workspace bytes, building it on first need; a str says why it failed."""
        if name not in self.built:
            try:
                self.graph.build_plan_at_index(self.index[name])
                self.built[name] = int(self.graph.get_workspace_size_plan_at_index(self.index[name]))
            except Exception as exc:
                self.built[name] = f"{type(exc).__name__}: {exc}"
        return self.built[name]

    def execute(self, name: str, pointers: dict[str, int], workspace: int) -> None:
        self.graph.execute_plan_at_index({self.uids[r]: a for r, a in pointers.items()}, workspace,
                                         self.index[name], handle=self.handle)


def _data_type(fe, dtype: str):
    return {"float32": fe.data_type.FLOAT, "float16": fe.data_type.HALF, "bfloat16": fe.data_type.BFLOAT16,
            "float64": fe.data_type.DOUBLE}[dtype]


class EnginesBackend:
    """Candidates and calls of the graph API, on `cudnn_handle` (the legacy backend's) where the
    frontend runs the same libcudnn as ucudnn's bindings, else on a frontend handle of its own.
    (A cuDNN handle holds device memory of its own: under memory pressure each one counts;
    docs/results-archive.md, "One cuDNN handle, and the frontier of pressure".)
    Graph API calls write out = conv: dispatch blends and sums around them (ucudnn.core.accumulation)."""

    name = NAME
    blends = False

    def __init__(self, cudnn_handle=None) -> None:
        self.fe = frontend()
        shared = cudnn_handle is not None and library.copies_loaded() == 1
        self.cudnn_handle = cudnn_handle if shared else None
        self.handle = _wrapped(self.fe, cudnn_handle) if shared else self.fe.create_handle()
        self.owns_handle = not shared
        self.stream = 0
        self._graphs: dict[str, KernelGraph] = {}

    def graph(self, problem: ConvProblem) -> KernelGraph:
        if problem.key not in self._graphs:
            self._graphs[problem.key] = KernelGraph(self.fe, problem, self.handle)
        return self._graphs[problem.key]

    def ranked(self, problem: ConvProblem) -> list[str]:
        """Candidate ids in the heuristics' order (modes A, B, FALLBACK), no plan built, none
        that is not accurate enough for the kernel (ucudnn.core.accuracy); one NO_CANDIDATE where the
        frontend refuses the graph or cuDNN supports it with no engine."""
        try:
            names = list(self.graph(problem).index)
        except BackendUnavailableError:
            raise
        except Exception:  # the frontend refuses the graph itself (e.g. a layout it cannot express)
            names = []
        ids = (candidate_id(NAME, name) for name in names)
        return [c for c in ids if accurate(problem, c)] or [NO_CANDIDATE]

    def candidate(self, problem: ConvProblem, candidate: str) -> Candidate:
        """The candidate with its plan's workspace, building the plan (FAILED where it cannot)."""
        if candidate == NO_CANDIDATE:
            return Candidate(NO_CANDIDATE, 0, UNSUPPORTED)
        built = self.graph(problem).build(split_id(candidate)[1])
        return Candidate(candidate, 0, FAILED) if isinstance(built, str) else Candidate(candidate, built, OK)

    def prepare(self, step: Step) -> Plan:
        p, name = step.problem, split_id(step.algo)[1]
        graph = self.graph(p)
        workspace = graph.build(name) if name in graph.index else "not listed by heuristics here"
        if isinstance(workspace, str):
            raise CandidateError(f"candidate {step.algo} of {p.describe()} cannot be built here "
                                 f"({workspace}); re-measure the kernel (ucudnn bench) with this cuDNN")
        if (step.route.alpha, step.route.beta) != (1.0, 0.0):
            raise ValueError(f"a graph API call cannot blend (route {step.route}); dispatch routes it")
        out = OUTPUT[p.kind]

        def run(x: int, w: int, y: int, target: int, workspace: int, workspace_size: int) -> None:
            addresses = {"x": x, "w": w, "y": y}
            addresses[out] = target
            graph.execute(name, addresses, workspace)

        return Plan(run, workspace)

    def set_stream(self, stream: int) -> None:
        self.stream = stream
        if self.cudnn_handle is None:  # the frontend's handle, its own (owns_handle)
            self.fe.set_stream(handle=self.handle, stream=stream)
            return
        # shared: the legacy backend (or a benchmarker) may have moved the handle's stream under
        # the frontend's cached one, so set it through the bindings, always, and keep the cache true
        bindings.set_stream(self.cudnn_handle, stream)
        if hasattr(self.handle, "stream"):
            self.handle.stream = stream

    def release(self) -> None:
        """Forget the graphs and their plans; calls prepared from them keep what they run."""
        self._graphs = {}

    def close(self) -> None:
        """Destroy the frontend handle if it is this backend's own (calls prepared on it end)."""
        if self.owns_handle and self.handle is not None:
            self.fe.destroy_handle(self.handle)
        self.handle = None


def _wrapped(fe, cudnn_handle):
    """ucudnn's cuDNN handle (a c_void_p) as the frontend takes one: a `cudnn.Handle` (frontend
    1.2x and later), or the bare address (earlier ones)."""
    address = int(cudnn_handle.value)
    if not hasattr(fe, "Handle"):
        return address
    return fe.Handle(address, gpu.cupy().cuda.runtime.getDevice(), bindings.get_stream(cudnn_handle))


def open_backend(cudnn_handle) -> EnginesBackend:
    """On `cudnn_handle` where the frontend runs the same libcudnn (see EnginesBackend)."""
    return EnginesBackend(cudnn_handle)
