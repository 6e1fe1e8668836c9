"""What the single-question GPU probes of bench/ (alignment, host_bound, beta_probe) share: an
`--out` folder, a cuDNN handle on the current stream, and one JSON report written at the end."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ucudnn import gpu
from ucudnn.bindings import cudnn


def start(doc: str, argv=None) -> tuple[Path, int, object]:
    """Parse `--out` (the script's docstring is its help); returns (out, stream, cuDNN handle)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out")
    args = parser.parse_args(argv)
    stream = gpu.current_stream()
    return Path(args.out), stream, cudnn.create_handle(stream)


def write_report(out: Path, name: str, report) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(report, indent=1))
