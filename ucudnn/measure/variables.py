"""The benchmark database's variable, apart from the cache package (cache/, which needs SQLite's
libraries) so that settings (ucudnn.plan.config) read it without them: UCUDNN_CACHE chooses the
database (cache.paths.cache_path), and UCUDNN_CACHE_PATH, named as the `cache_path` setting's would
be, is refused wherever set, so that no one takes it to choose the database."""
from __future__ import annotations

from collections.abc import Mapping

from ..core.errors import ConfigError

CACHE_VARIABLE = "UCUDNN_CACHE"  # the one variable that chooses the database
MISNAMED_VARIABLE = "UCUDNN_CACHE_PATH"  # not read: refused (refuse_misnamed)


def refuse_misnamed(env: Mapping[str, str]) -> None:
    """ConfigError where `env` sets MISNAMED_VARIABLE, naming CACHE_VARIABLE."""
    if MISNAMED_VARIABLE in env:
        raise ConfigError(f"{MISNAMED_VARIABLE}={env[MISNAMED_VARIABLE]!r} is not read: the benchmark "
                          f"database's variable is {CACHE_VARIABLE}; set {CACHE_VARIABLE} instead and unset "
                          f"{MISNAMED_VARIABLE}")
