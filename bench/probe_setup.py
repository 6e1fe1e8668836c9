"""What the GPU benchmarks of bench/ that time single kernels (host_path, slices)
share: an `--out` folder, a cuDNN handle on the current stream, a kernel looked up by name,
graph timing, and one JSON report written at the end."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ucudnn.execute import gpu
from ucudnn.execute.bindings import cudnn
from ucudnn.core.nets import find_kernel, get_network
from ucudnn.core.problem import ConvProblem


def start(doc: str, argv=None) -> tuple[Path, int, object]:
    """Parse `--out` (the script's docstring is its help); returns (out, stream, cuDNN handle)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    stream = gpu.current_stream()
    return Path(args.out), stream, cudnn.create_handle(stream)


def problem_of(net: str, batch: int, name: str, dtype: str = "float32", layout: str = "nchw") -> ConvProblem:
    """The kernel `name` ("conv2/F") of network `net` at mini-batch `batch`, its dtype's default math."""
    return find_kernel(get_network(net).problems(batch, dtype, layout=layout), name).problem


def median_ms(run, stream: int, warmup: int, repeats: int, hide_host: bool = False) -> float:
    """Median milliseconds of run() after `warmup` untimed calls (see gpu.time_calls)."""
    gpu.time_calls(run, warmup, stream, hide_host=hide_host)
    return statistics.median(gpu.time_calls(run, repeats, stream, hide_host=hide_host))


def write_report(out: Path, name: str, report) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(report, indent=1))
