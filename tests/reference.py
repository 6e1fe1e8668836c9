"""A float64 NumPy convolution (F, BD, BF; any number of spatial dimensions, groups, dilation).

It is the ground truth of the tests, on the CPU and on the GPU. Arrays are logical
(N, C, *spatial) / (K, C/groups, *kernel); `to_logical`/`from_logical` convert packed layouts.
"""
from __future__ import annotations

import itertools

import numpy as np

from ucudnn.core.problem import ConvKind, ConvProblem


def to_logical(array: np.ndarray, layout: str) -> np.ndarray:
    """(N, *spatial, C) -> (N, C, *spatial) for channels-last; unchanged for nchw."""
    return np.moveaxis(array, -1, 1) if layout == "nhwc" else array


def from_logical(array: np.ndarray, layout: str) -> np.ndarray:
    return np.moveaxis(array, 1, -1) if layout == "nhwc" else array


def stored_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The shape of a packed tensor in memory order (filters too: KCRS or KRSC)."""
    return (shape[0], *shape[2:], shape[1]) if layout == "nhwc" else tuple(shape)


def _windows(p: ConvProblem, x_padded: np.ndarray):
    """For each kernel offset r: (r, the strided window of x_padded that meets w[..., r])."""
    out = p.y_shape[2:]
    for r in itertools.product(*(range(k) for k in p.w_shape[2:])):
        index = tuple(
            slice(ri * d, ri * d + s * (o - 1) + 1, s)
            for ri, d, s, o in zip(r, p.dilations, p.strides, out)
        )
        yield r, (slice(None), slice(None)) + index


def _grouped(a: np.ndarray, groups: int) -> np.ndarray:
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, *a.shape[2:])


def _weights(p: ConvProblem, w: np.ndarray) -> np.ndarray:
    w = w.astype(np.float64)
    if p.mode == "convolution":
        w = np.flip(w, axis=tuple(range(2, w.ndim)))
    return w.reshape(p.groups, p.w_shape[0] // p.groups, *w.shape[1:])


def _pad(p: ConvProblem, a: np.ndarray) -> np.ndarray:
    return np.pad(a.astype(np.float64), [(0, 0), (0, 0)] + [(q, q) for q in p.pads])


def _crop(p: ConvProblem, a: np.ndarray) -> np.ndarray:
    return a[(slice(None), slice(None)) + tuple(slice(q, q + n) for q, n in zip(p.pads, p.x_shape[2:]))]


def forward(p: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    xp, wg = _pad(p, x), _weights(p, w)
    y = np.zeros((p.batch, p.groups, p.w_shape[0] // p.groups, *p.y_shape[2:]))
    for r, window in _windows(p, xp):
        y += np.einsum("ngc...,gkc->ngk...", _grouped(xp[window], p.groups), wg[(Ellipsis, *r)])
    return y.reshape(p.y_shape)


def backward_data(p: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    wg, dyg = _weights(p, w), _grouped(dy.astype(np.float64), p.groups)
    dx = np.zeros((p.batch, p.x_shape[1], *(n + 2 * q for n, q in zip(p.x_shape[2:], p.pads))))
    for r, window in _windows(p, dx):
        contribution = np.einsum("ngk...,gkc->ngc...", dyg, wg[(Ellipsis, *r)])
        dx[window] += contribution.reshape(contribution.shape[0], -1, *contribution.shape[3:])
    return _crop(p, dx)


def backward_filter(p: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    xp, dyg = _pad(p, x), _grouped(dy.astype(np.float64), p.groups)
    dw = np.zeros((p.groups, p.w_shape[0] // p.groups, *p.w_shape[1:]))
    for r, window in _windows(p, xp):
        xg = _grouped(xp[window], p.groups)
        dw[(Ellipsis, *r)] = np.einsum("ngkp,ngcp->gkc", dyg.reshape(*dyg.shape[:3], -1),
                                       xg.reshape(*xg.shape[:3], -1))
    dw = dw.reshape(p.w_shape)
    return np.flip(dw, axis=tuple(range(2, dw.ndim))) if p.mode == "convolution" else dw


def convolve(p: ConvProblem, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The output of kernel p (y for F, dx for BD, dw for BF) from the logical operands it reads:
    x and w for F, dy (passed as y) and w for BD, x and dy for BF."""
    if p.kind is ConvKind.FORWARD:
        return forward(p, x, w)
    if p.kind is ConvKind.BACKWARD_DATA:
        return backward_data(p, y, w)
    return backward_filter(p, x, y)


def transposed_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """Logical weights (K, C/groups, *kernel) with K and C swapped per group, (C, K/groups, *kernel),
    and the kernel flipped (ucudnn.core.transposition)."""
    k, per_group, *kernel = w.shape
    swapped = w.reshape(groups, k // groups, per_group, *kernel).swapaxes(1, 2)
    return np.ascontiguousarray(np.flip(swapped, axis=tuple(range(3, w.ndim + 1)))
                                .reshape(per_group * groups, k // groups, *kernel))
