"""On a node with 2 GPUs of one model: measurements taken on two GPUs at once have the structure
of those taken on one (the same kernels, micro-batch sizes, algorithms and statuses)."""
from __future__ import annotations

import sqlite3

import pytest

from ucudnn.core.nets import get_network
from ucudnn.measure.parallel import bench_on_devices, cuda_device_count
from ucudnn.plan.config import batch_sizes

pytestmark = pytest.mark.gpu
PROBLEMS = [k.problem for k in get_network("alexnet").problems(8)]  # 15 kernels, 4 sizes each


def sizes_for(problem):
    return batch_sizes("powerOfTwo", problem.batch)


@pytest.fixture
def two_gpus() -> None:
    count = cuda_device_count()
    if count < 2:
        pytest.skip(f"needs 2 GPUs of one model; this node has {count}")


def structure(path) -> dict[tuple, str]:
    """(GPU, cuDNN, shape key, micro-batch, algorithm) -> status of every measurement."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT gpu_name, cudnn_version, shape_key, batch, algo, status FROM measurements")
        return {tuple(row[:5]): row[5] for row in rows}


def test_two_gpus_record_what_one_does(tmp_path, two_gpus):
    one = bench_on_devices(PROBLEMS, sizes_for, None, tmp_path / "one.db", [0], timing="quick")
    two = bench_on_devices(PROBLEMS, sizes_for, None, tmp_path / "two.db", [0, 1], timing="quick")
    assert one.reuse_key == two.reuse_key
    a, b = structure(tmp_path / "one.db"), structure(tmp_path / "two.db")
    assert len({key[2] for key in a}) == len(PROBLEMS) and {key[3] for key in a} == {1, 2, 4, 8}
    assert set(a) == set(b), f"only on 1 GPU: {sorted(set(a) - set(b))[:5]}; only on 2: {sorted(set(b) - set(a))[:5]}"
    assert a == b, [f"{k}: {a[k]} vs {b[k]}" for k in a if a[k] != b[k]][:5]
