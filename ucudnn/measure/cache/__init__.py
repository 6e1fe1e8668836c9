"""Caching of benchmark results and optimized configurations (paper section III-D).

`Cache` is what the handle uses: a per-process memo in front of a `BenchmarkDatabase` file that
processes on many nodes can share. See docs/cache.md.
"""
from .database import BenchmarkDatabase
from .memo import Cache, CacheStats, resolve_path
from .merging import merge
from .paths import CACHE_VARIABLE, cache_path, default_path, recorded_path, recorded_paths, shard_path, shard_paths
from .schema import SCHEMA_VERSION, ForeignFileError, NewerSchemaError

__all__ = ["Cache", "cache_path", "CACHE_VARIABLE", "CacheStats", "BenchmarkDatabase", "merge", "shard_path",
           "shard_paths", "default_path", "recorded_path", "recorded_paths", "resolve_path", "SCHEMA_VERSION", "NewerSchemaError",
           "ForeignFileError"]
