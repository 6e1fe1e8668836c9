"""Shared setup of the test suite.

Kept small on purpose: hooks (for example a `gpu` marker skip in `pytest_collection_modifyitems`)
can be added below without touching what is here.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import settings

# No per-example deadline: the float64 reference is slow on first call (NumPy warm-up) and on
# loaded CI machines; each property test sets its own max_examples to keep the suite fast.
settings.register_profile("ucudnn", deadline=None, print_blob=True)
settings.load_profile("ucudnn")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A NumPy generator seeded from the test's id: reproducible, different for every test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Every test sees ucudnn's once-per-process warnings afresh (ucudnn.core.fallback)."""
    from ucudnn.core import fallback

    monkeypatch.setattr(fallback, "_warned", set())


@pytest.fixture
def ucudnn_stderr():
    """The `ucudnn` logger's lines on stderr while the test runs, as the CLI writes them."""
    from ucudnn.core.log import logging_to_stderr

    with logging_to_stderr():
        yield


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, with the reason, where no GPU with CuPy and cuDNN is usable."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from ucudnn.execute.bindings import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy and cuDNN 9 (none usable here)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With UCUDNN_TEST_TIMES set to a file, each test's seconds (setup, call and teardown
    each) are appended to it as the test ends: a run cut short by a time limit still says where
    its time went (bench/gpu_suite.sh sets it)."""
    import os

    path = os.environ.get("UCUDNN_TEST_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
