"""Parallel benchmarking (paper, section III-D): the sweep of (kernel, micro-batch size, backend)
tasks spread over the GPUs of a node, one worker process per GPU, or over the ranks of an MPI job,
and recorded in one database as a single-GPU run would record it. See docs/parallel.md.

A task is one kernel at one micro-batch size with one backend: measuring it times every
candidate of that backend at that size. Tasks are what the database lacks for each backend the
`backend` setting selects (so a second run measures nothing), split by `partition`,
which is deterministic: every MPI rank computes the same shares. Workers write their own shard
files, merged into the target when they are done; a worker that dies loses nothing it recorded,
and what it had left is measured again once by the workers that survived, or reported missing.

`ucudnn bench` (ucudnn.cli) is its command line; under MPI: `python -m mpi4py -m ucudnn bench --mpi ...`.

Modules: `tasks` (tasks, their partition and the retrying sweep), `devices` (GPU checks, backends and
timing presets), `pool` (one worker process per GPU, shard files), `mpi` (the ranks of an MPI
job). Their public names are re-exported here.
"""
from .devices import (
    DEVICES_VARIABLE,
    TIMINGS,
    Factory,
    backend_setting,
    bench_devices,
    check_devices,
    check_one_model,
    cuda_benchmarker,
    cuda_device_count,
    cuda_probe,
    default_factory,
    parse_devices,
    timing_settings,
)
from .mpi import LAUNCHER_SIZE_VARIABLES, bench_with_mpi, check_ranks_fit, check_world, mpi_world, on_root
from .pool import (
    EXIT_GRACE_S,
    PoolRound,
    WorkerJob,
    bench_on_devices,
    exit_reason,
    merge_shards,
    new_shard_dir,
    remove_if_empty,
    run_worker,
)
from .tasks import (
    BACKEND_WEIGHTS,
    ENGINE_TASK_WEIGHT,
    RETRIES,
    SIZES_PER_CALL,
    TASK_OVERHEAD_FLOPS,
    KernelProgress,
    MeasureCall,
    Progress,
    SizesFor,
    Task,
    calls,
    measure_share,
    missing_message,
    partition,
    split_tasks,
    sweep,
)

__all__ = [
    # tasks
    "Task", "split_tasks", "partition", "calls", "measure_share", "KernelProgress", "sweep", "missing_message",
    "SizesFor", "Progress", "MeasureCall", "SIZES_PER_CALL", "TASK_OVERHEAD_FLOPS", "ENGINE_TASK_WEIGHT",
    "BACKEND_WEIGHTS", "RETRIES",
    # devices
    "TIMINGS", "DEVICES_VARIABLE", "Factory", "timing_settings", "cuda_benchmarker", "default_factory",
    "cuda_device_count", "cuda_probe", "check_devices", "check_one_model", "bench_devices", "parse_devices",
    "backend_setting",
    # pool
    "new_shard_dir", "merge_shards", "remove_if_empty", "WorkerJob", "run_worker", "exit_reason", "PoolRound",
    "bench_on_devices", "EXIT_GRACE_S",
    # mpi
    "mpi_world", "check_world", "on_root", "check_ranks_fit", "bench_with_mpi", "LAUNCHER_SIZE_VARIABLES",
]
