"""Borrowing torch's cuDNN handle (ucudnn/integrations/torch/torch_handle.py) and running on a
lent handle (ucudnn.Handle): each condition that makes ucudnn fall back to a handle of its own,
and the stream rule, with fakes of libtorch_cuda, the process's mapped libraries and cuDNN."""
from __future__ import annotations

import ctypes
import threading
import warnings

import pytest

from test_graphs import FakeCapturer, Recorder

torch = pytest.importorskip("torch")

from ucudnn import handle as handles  # noqa: E402
from ucudnn.core.problem import ConvKind, ConvProblem  # noqa: E402
from ucudnn.execute.bindings import cudnn, library  # noqa: E402
from ucudnn.integrations.torch import torch_handle  # noqa: E402
from ucudnn.integrations.torch.torch_handle import SYMBOL, TORCHS, torch_cudnn_handle  # noqa: E402
from ucudnn.plan.config import Settings  # noqa: E402

TORCH_CUDA = "/site/torch/lib/libtorch_cuda.so"
PROBLEM = ConvProblem(ConvKind.FORWARD, (8, 3, 32, 32), (16, 3, 3, 3))


class FakeGet:
    """at::native::getCudnnHandle as ctypes exposes it: restype and argtypes set by the caller."""

    def __init__(self, address):
        self.address, self.restype, self.argtypes, self.calls = address, None, None, 0

    def __call__(self):
        self.calls += 1
        return self.address


class FakeLibrary:
    def __init__(self, get=None):
        if get is not None:
            setattr(self, SYMBOL, get)


@pytest.fixture
def process(monkeypatch):
    """One libcudnn and libtorch_cuda mapped; `process["libs"]` maps a soname prefix to paths."""
    state = {"libs": {library.SONAME: ["/site/nvidia/cudnn/lib/libcudnn.so.9"], torch_handle.LIBRARY: [TORCH_CUDA]}}

    def mapped(soname=library.SONAME):
        return {(str(i), "0"): path for i, path in enumerate(state["libs"].get(soname, []))}
    monkeypatch.setattr(library, "mapped", mapped)
    return state


def lend(get=FakeGet(0xBEEF), warm=lambda device: None, opened=None):
    def load(path):
        if opened is not None:
            opened.append(path)
        return FakeLibrary(get)
    return torch_cudnn_handle("cuda:0", warm=warm, load=load)


def test_torchs_handle_is_borrowed_after_torch_convolves_on_this_thread(process):
    get, warmed, opened = FakeGet(0xBEEF), [], []
    lent = lend(get, warm=warmed.append, opened=opened)
    assert lent.source == TORCHS and lent.handle.value == 0xBEEF
    assert warmed == ["cuda:0"] and opened == [TORCH_CUDA] and get.calls == 1
    assert get.restype is ctypes.c_void_p and get.argtypes == []  # a pointer back, not a truncated int


def test_outside_the_main_thread_ucudnn_makes_its_own(process):
    found = []
    thread = threading.Thread(target=lambda: found.append(lend()))
    thread.start()
    thread.join()
    assert found[0].handle is None and "outside the main thread" in found[0].source


@pytest.mark.parametrize("copies", [0, 2])
def test_without_exactly_one_libcudnn_ucudnn_makes_its_own(process, copies):
    process["libs"][library.SONAME] = [f"/lib{i}/libcudnn.so.9" for i in range(copies)]
    lent = lend()
    assert lent.handle is None and f"{copies} copies of libcudnn" in lent.source


def test_where_torchs_own_convolution_fails_ucudnn_makes_its_own(process):
    def out_of_memory(device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    get = FakeGet(0xBEEF)
    lent = lend(get, warm=out_of_memory)
    assert lent.handle is None and "Tried to allocate 2.00 MiB" in lent.source
    assert get.calls == 0  # never called where torch might have to create the handle (a C++ throw)


def test_without_libtorch_cuda_or_its_symbol_ucudnn_makes_its_own(process):
    lent = lend(get=None)
    assert lent.handle is None and "does not export at::native::getCudnnHandle" in lent.source
    lent = lend(get=FakeGet(0))
    assert lent.handle is None and "returned no handle" in lent.source
    process["libs"][torch_handle.LIBRARY] = []
    lent = lend()
    assert lent.handle is None and "libtorch_cuda.so is not loaded" in lent.source


def test_the_backend_runs_on_torchs_handle_and_says_whose_it_is(process, monkeypatch):
    from ucudnn.core import fallback
    from ucudnn.integrations.torch import TorchFramework, kernels

    made = []
    monkeypatch.setattr(handles, "Handle", lambda settings, **kwargs: made.append(kwargs) or "handle")
    monkeypatch.setattr(kernels, "torch_cudnn_handle", lambda device: torch_handle.Lent(ctypes.c_void_p(7), TORCHS))
    monkeypatch.setattr(TorchFramework, "stream", lambda self, device: 0)
    monkeypatch.setattr(fallback, "_warned", set())
    framework = TorchFramework()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's handle: nothing to warn about
        assert framework.make_handle(Settings.load(env={}), None, torch.device("cuda", 0)) == "handle"
    assert made[0]["cudnn_handle"].value == 7 and framework.cudnn_handles == {"cuda:0": TORCHS}
    own = torch_handle.Lent(None, "ucudnn's own: 2 copies of libcudnn are loaded")
    monkeypatch.setattr(kernels, "torch_cudnn_handle", lambda device: own)
    with pytest.warns(UserWarning, match="a cuDNN handle of its own .* 2 copies of libcudnn"):
        framework.make_handle(Settings.load(env={}), None, torch.device("cuda", 1))
    assert made[1]["cudnn_handle"] is None and framework.cudnn_handles["cuda:1"] == own.source


# --- ucudnn.Handle on a lent handle ----------------------------------------------------------------

class FakeBackends:
    names = ["fake"]

    def __init__(self):
        self.streams = []

    def set_stream(self, stream):
        self.streams.append(stream)

    def close(self):
        pass


@pytest.fixture
def lent_streams(monkeypatch):
    """cudnnSetStream calls on any handle, in order: (handle, stream)."""
    calls = []
    monkeypatch.setattr(cudnn, "set_stream", lambda handle, stream: calls.append((handle, stream)))
    monkeypatch.setattr(handles, "open_backends", lambda choice, handle, stream: FakeBackends())
    monkeypatch.setattr(handles, "compile_program", lambda *args: Recorder())
    monkeypatch.setattr(handles, "GraphCapturer", lambda redirect, stream, make_room: FakeCapturer())
    return calls


@pytest.mark.parametrize("execution", ["graph", "direct"])
def test_a_lent_handle_is_set_to_our_stream_before_every_direct_run(lent_streams, execution):
    handle = handles.Handle(cache=object(), cudnn_handle="torchs", stream=5, execution=execution)
    program = handle.program(PROBLEM, "configuration")
    program(1, 2, 3, 4, 5)  # direct (graph execution: the first sight of these addresses)
    assert lent_streams == [("torchs", 5)]
    program(1, 2, 3, 4, 5)
    program(1, 2, 3, 4, 5)
    if execution == "graph":  # a capture (redirected by the capturer) and a replay: no stream set
        assert lent_streams == [("torchs", 5)] and program.replays == 2
    else:
        assert lent_streams == [("torchs", 5)] * 3
    handle.close()
    assert handle.cudnn_handle is None and lent_streams[-1] == ("torchs", 5)  # a lent handle is not destroyed


def test_a_handle_of_its_own_is_not_set_before_each_run(lent_streams, monkeypatch):
    monkeypatch.setattr(cudnn, "create_handle", lambda: "ours")
    destroyed = []
    monkeypatch.setattr(cudnn, "destroy_handle", destroyed.append)
    handle = handles.Handle(cache=object(), stream=5, execution="direct")
    program = handle.program(PROBLEM, "configuration")
    program(1, 2, 3, 4, 5)
    assert lent_streams == [] and program.runs == [(1, 2, 3, 4, 5)]
    handle.close()
    assert destroyed == ["ours"]


def test_a_device_that_is_not_cuda_is_refused_before_torch_is_asked(process):
    """torch aborts the process when asked for its cuDNN handle with no CUDA device (a CUDA build
    of torch on a machine without a GPU): a device other than CUDA is refused first."""
    warmed, opened = [], []
    lent = torch_cudnn_handle("cpu", warm=warmed.append, load=lambda path: opened.append(path))
    assert lent.handle is None and "cpu is not a CUDA device" in lent.source
    assert warmed == [] and opened == []
