"""Recorded benchmark databases (real GPU measurements), installed as the package `ucudnn.recorded`.

Each `<gpu>-cudnn<version>.db` file here is a `ucudnn.measure.cache.BenchmarkDatabase`; find them with
`ucudnn.measure.cache.recorded_paths()` / `recorded_path()`. See docs/cache.md.
"""
