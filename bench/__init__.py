"""The GPU benchmarks (bench/gpu_suite.sh runs them); `bench.common` holds what they share.
Run from the repository root with PYTHONPATH=. so that `from bench import common` resolves."""
