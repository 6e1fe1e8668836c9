"""The problem model and its rules, pure Python: convolution problems and networks of them
(nets/), measurements, micro-batch slices (staging), sums over micro-batches (accumulation,
accuracy), one workspace divided among concurrent kernels (workspace, schedule), the device a
measurement was taken on, ranks, errors, the `ucudnn` logger, and a stretch of work's time budget
(budget).

May import: nothing else of ucudnn (docs/architecture.md; tests/test_imports.py checks)."""
