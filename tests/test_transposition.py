"""A data gradient as a forward convolution (ucudnn.core.transposition): the F it names computes BD's dx
exactly (float64 reference), for 1-D, 2-D and 3-D kernels, groups, dilations, paddings and both
modes; it names none where there is none, and where C = K and the padding keeps the size, it is
the layer's own forward convolution."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.core.transposition import FASTER, as_forward, faster, transposed_shape

import reference

BD = ConvKind.BACKWARD_DATA


@pytest.mark.parametrize("x_shape, w_shape, pads, dilations, groups, mode", [
    ((3, 4, 17), (5, 4, 3), 1, 1, 1, "cross_correlation"),
    ((2, 6, 9, 11), (4, 3, 3, 5), (0, 2), (2, 1), 2, "cross_correlation"),
    ((2, 4, 5, 6, 7), (4, 2, 3, 1, 3), (2, 0, 1), 1, 2, "convolution"),
    ((1, 3, 12, 12), (6, 1, 4, 4), (3, 1), (1, 1), 3, "cross_correlation"),
])
def test_the_forward_convolution_of_dy_is_the_data_gradient(rng, x_shape, w_shape, pads, dilations, groups, mode):
    bd = ConvProblem(BD, x_shape, w_shape, pads=pads, dilations=dilations, groups=groups, mode=mode)
    forward = as_forward(bd)
    assert forward.kind is ConvKind.FORWARD and forward.x_shape == bd.y_shape and forward.y_shape == bd.x_shape
    assert forward.w_shape == transposed_shape(bd.w_shape, groups) and forward.mode == bd.mode
    dy, w = rng.standard_normal(bd.y_shape), rng.standard_normal(bd.w_shape)
    np.testing.assert_allclose(reference.forward(forward, dy, reference.transposed_weights(w, groups)),
                               reference.backward_data(bd, dy, w), rtol=1e-12, atol=1e-12)


def test_no_forward_convolution_where_there_is_none():
    assert as_forward(ConvProblem(BD, (2, 4, 9, 9), (4, 4, 3, 3), strides=2)) is None  # dy would need dilating
    assert as_forward(ConvProblem(BD, (2, 4, 9, 9), (4, 4, 3, 3), pads=(3, 1))) is None  # padding above k - 1
    assert as_forward(ConvProblem(ConvKind.FORWARD, (2, 4, 9, 9), (4, 4, 3, 3))) is None
    assert as_forward(ConvProblem(ConvKind.BACKWARD_FILTER, (2, 4, 9, 9), (4, 4, 3, 3))) is None
    assert as_forward(ConvProblem(BD, (2, 4, 9, 9), (4, 4, 3, 3), pads=(2, 2))) is not None  # exactly k - 1


def test_the_forward_plan_runs_only_where_it_is_clearly_faster():
    assert faster(2.95, 10.85) and not faster(FASTER * 10.0, 10.0) and not faster(10.0, 9.0)


def test_a_size_keeping_layer_with_as_many_outputs_as_inputs_has_its_own_forward_convolution():
    for pads, dilations in [((1, 1), 1), ((2, 4), (2, 4))]:
        bd = ConvProblem(BD, (2, 8, 9, 9), (8, 8, 3, 3), pads=pads, dilations=dilations)
        assert as_forward(bd) == bd.with_kind(ConvKind.FORWARD)
        assert as_forward(bd).key == bd.with_kind(ConvKind.FORWARD).key  # one sweep serves both
