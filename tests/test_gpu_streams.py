"""GPU: a model's independent nodes on several streams (ucudnn.integrations.torch.streams):
torchvision GoogLeNet in fp16 inference, its nodes timed with CUDA events and scheduled on four
streams, gives the one-stream model's output, eagerly and replayed as one CUDA graph."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ucudnn.core.schedule import table  # noqa: E402
from ucudnn.integrations.torch.streams import Streamed  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]


@pytest.mark.parametrize("batch, critical_first", [(1, True), (32, True), (32, False)])
def test_googlenet_on_four_streams_equals_one_stream(batch, critical_first):
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    torch.manual_seed(0)
    model = torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True).cuda().half().eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = model(x)
        streamed = Streamed(model, x, streams=4, critical_first=critical_first)
        print(table(streamed.plan))
        assert streamed.plan.streams > 1 and streamed.plan.makespan_ms < sum(
            p.end_ms - p.start_ms for p in streamed.plan.placements.values())
        torch.testing.assert_close(streamed(x), want)
        static = x.clone()
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            streamed(static)  # warm-up on a side stream, as torch.cuda.graphs documents
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = streamed(static)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want)


def relative_error(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_a_converted_googlenet_on_four_streams_equals_one_stream():
    """Every convolution through ucudnn (delegation off, 64 MiB per kernel: each borrows its
    workspace from torch's caching allocator on the stream it runs on, so kernels on different
    streams never share workspace bytes), scheduled on four streams and replayed as one CUDA graph."""
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    import ucudnn.torch as ut

    torch.manual_seed(0)
    model = torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True).cuda().half().eval()
    x = torch.randn(8, 3, 224, 224, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = model(x)
        ut.convert(model, workspace_limit="64MiB", planning="first_call", delegate=False)
        model(x)  # planned
        streamed = Streamed(model, x, streams=4)
        assert relative_error(streamed(x), want) < 1e-2  # other kernels than torch's: fp16 rounding apart
        static, graph, side = x.clone(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            streamed(static)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = streamed(static)
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, want) < 1e-2
    runs = ut.context_of(model).runs
    assert runs["ucudnn", "F"] > 0 and not runs.get(("torch", "layer"))
