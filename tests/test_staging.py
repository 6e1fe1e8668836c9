"""Staging (ucudnn.core.staging): which slices of a part are copied through the workspace, and what it costs."""
from __future__ import annotations

import pytest

from ucudnn.core.problem import ConvProblem
from ucudnn.core.staging import ALIGNED, SLICE_ALIGNMENT, Slices, copy_ms, slices_of
from ucudnn.core.workspace import align_up


def test_a_slice_is_staged_exactly_where_it_starts_off_the_alignment():
    conv1 = ConvProblem("F", (256, 3, 227, 227), (96, 3, 11, 11), strides=4)  # x: 618,348 B a sample
    slices = slices_of(conv1)
    assert (slices.x, slices.y) == (618348, 96 * 55 * 55 * 4)
    for start in range(256):
        expected = tuple(t for t in "xy" if start * conv1.sample_bytes(t) % SLICE_ALIGNMENT)
        assert slices.staged(start) == expected
    assert slices.staged(0) == slices.staged(64) == ()  # 64 x 618,348 is a multiple of 256
    assert slices.staged(32) == ("x",)  # y's sample (1,161,600 B) is 128-byte aligned: 32 of them are 256
    assert slices.staged(1) == ("x", "y")
    assert ALIGNED.classes(1000) == [()]


def test_staging_costs_the_copies_bytes_and_time():
    slices = Slices(x=100, y=1000)
    assert slices.extra((), 7) == (0.0, 0)
    ms, nbytes = slices.extra(("x", "y"), 7)
    assert nbytes == align_up(700) + align_up(7000) and nbytes % SLICE_ALIGNMENT == 0
    assert ms == pytest.approx(copy_ms(align_up(700)) + copy_ms(align_up(7000)))
    assert copy_ms(0) == 0.0 and copy_ms(2**20) < copy_ms(2**24)
    assert set(Slices(x=64, y=1000).classes(8)) == {(), ("y",), ("x", "y")}  # x aligned at every 4th sample
