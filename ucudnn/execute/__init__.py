"""Executing on the GPU: cuDNN's bindings, the backends that build and run a kernel's candidates
(legacy algorithms, graph-API engines; one file each, found by name), the dispatch of a division's
micro-batches, CUDA graphs of them, and whether a GPU is here.

May import: core, optimizers (docs/architecture.md; tests/test_imports.py checks)."""
