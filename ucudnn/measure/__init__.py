"""Measuring: the benchmark that times a kernel's candidates at each micro-batch size, the SQLite
database that keeps what was measured (cache/) and the variable that chooses it (variables), and
benchmarking on several GPUs (parallel/).

May import: core, optimizers, execute (docs/architecture.md; tests/test_imports.py checks)."""
