"""Hypothesis strategies shared by the CPU tests."""
from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def geometry(draw, nd: int, size_limit: int, max_groups: int, max_pad: int, max_stride: int,
             max_group_channels: int) -> dict:
    """A valid N-d convolution geometry: kernel, dilations, pads, strides, input sizes (no
    smaller than the dilated kernel allows), groups and input channels per group."""
    kernel = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    dilations = draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd))
    pads = draw(st.lists(st.integers(0, max_pad), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, max_stride), min_size=nd, max_size=nd))
    lows = [max(1, d * (k - 1) + 1 - 2 * q) for k, d, q in zip(kernel, dilations, pads)]
    sizes = [draw(st.integers(lo, max(lo, size_limit))) for lo in lows]
    return dict(kernel=kernel, dilations=dilations, pads=pads, strides=strides, sizes=sizes,
                groups=draw(st.integers(1, max_groups)), group_channels=draw(st.integers(1, max_group_channels)))
