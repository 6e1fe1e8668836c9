"""ConvProblem: keys, output shape, validation, serialization."""
from __future__ import annotations

import json
from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ucudnn.core.errors import ConfigError
from ucudnn.core.problem import DTYPES, ITEMSIZE, LAYOUTS, MATH_TYPES, MODES, ConvKind, ConvProblem, default_math

BASE = dict(kind="F", x_shape=(8, 6, 14, 12), w_shape=(4, 3, 3, 3), pads=(1, 0), strides=(2, 1),
            dilations=(1, 2), groups=2, dtype="float32", compute_type="float32", math="default",
            layout="nchw", mode="cross_correlation")


def base(**changes) -> ConvProblem:
    return ConvProblem(**{**BASE, **changes})


# One change per field; every one must change the key. Batch is the only one that keeps shape_key.
FIELD_CHANGES = [
    ("kind", "BD"), ("kind", "BF"),
    ("x_shape", (16, 6, 14, 12)),  # batch
    ("x_shape", (8, 6, 15, 12)), ("x_shape", (8, 6, 14, 13)),
    ("x_shape", (8, 4, 14, 12)),  # channels (w_shape[1] * groups must match: see below)
    ("w_shape", (6, 3, 3, 3)), ("w_shape", (4, 3, 3, 1)), ("w_shape", (4, 3, 1, 3)),
    ("pads", (0, 0)), ("pads", (1, 1)), ("pads", (0, 1)),
    ("strides", (1, 1)), ("strides", (2, 2)),
    ("dilations", (1, 1)), ("dilations", (2, 2)),
    ("groups", 1), ("groups", 3),
    ("dtype", "float16"), ("dtype", "float64"), ("dtype", "bfloat16"),
    ("compute_type", "float16"), ("compute_type", "float64"),
    ("math", "tensor_op"), ("math", "tensor_op_allow_conversion"), ("math", "fma"),
    ("layout", "nhwc"),
    ("mode", "convolution"),
    ("deterministic", True),
]


def _changed(name, value) -> ConvProblem:
    changes = {name: value}
    if name == "x_shape" and value[1] == 4:
        changes["w_shape"] = (4, 2, 3, 3)  # still groups=2
    if name == "groups":
        changes["x_shape"] = (8, 3 * value, 14, 12)
        changes["w_shape"] = (6, 3, 3, 3)
    return base(**changes)


def test_field_changes_cover_every_field():
    assert {name for name, _ in FIELD_CHANGES} == {f.name for f in fields(ConvProblem)}


def test_equal_fields_equal_keys():
    a, b = base(), base()
    assert a is not b and a == b and a.key == b.key and a.shape_key() == b.shape_key()
    assert hash(a) == hash(b)


def test_equivalent_spellings_have_equal_keys():
    canonical = base()
    spellings = [
        base(kind=ConvKind.FORWARD),
        base(x_shape=[8, 6, 14, 12], w_shape=[4, 3, 3, 3], pads=[1, 0], strides=[2, 1], dilations=[1, 2]),
        base(x_shape=np.array([8, 6, 14, 12]), w_shape=tuple(np.int64(v) for v in (4, 3, 3, 3))),
        base(compute_type=""),  # "" means float32 for float32 data
    ]
    for p in spellings:
        assert p == canonical and p.key == canonical.key
    assert base(dtype="float64", compute_type="").key == base(dtype="float64", compute_type="float64").key
    assert base(pads=0, dilations=1).key == base(pads=(0, 0), dilations=(1, 1)).key


def test_key_is_a_stable_string():
    """Keys index the benchmark cache across processes and versions: pin the exact format."""
    assert base().key == ("F|x=6x14x12|w=4x3x3x3|pad=1x0|str=2x1|dil=1x2|g=2|float32/float32|"
                          "math=default|nchw|cross_correlation|n=8")
    assert base().shape_key() == base().key.rsplit("|n=", 1)[0]


def test_a_deterministic_kernel_keeps_older_keys_and_gets_one_of_its_own():
    """Only a deterministic kernel's key names the setting: every key written before the field
    existed reads as a kernel that allows non-deterministic candidates, with no migration."""
    assert base().key == base(deterministic=False).key
    assert base(deterministic=True).shape_key() == base().shape_key() + "|deterministic"
    old_row = {k: v for k, v in base().to_dict().items()}
    assert "deterministic" not in old_row and not ConvProblem.from_dict(old_row).deterministic
    assert ConvProblem.from_dict(base(deterministic=True).to_dict()).deterministic
    assert base(deterministic=True).describe().endswith("nchw deterministic")
    with pytest.raises(ConfigError, match="deterministic='yes'.*True or False"):
        base(deterministic="yes")


@pytest.mark.parametrize("name, value", FIELD_CHANGES, ids=[f"{n}={v}" for n, v in FIELD_CHANGES])
def test_every_field_change_changes_the_key(name, value):
    p = _changed(name, value)
    assert p != base()
    assert p.key != base().key
    if name == "x_shape" and value[1:] == BASE["x_shape"][1:]:
        assert p.shape_key() == base().shape_key()  # the batch alone: measurements are shared
    else:
        assert p.shape_key() != base().shape_key()


def test_all_changed_keys_are_distinct():
    keys = [_changed(name, value).key for name, value in FIELD_CHANGES] + [base().key]
    assert len(set(keys)) == len(keys)


@settings(max_examples=50)
@given(batch=st.integers(1, 4096), other=st.integers(1, 4096))
def test_shape_key_excludes_batch(batch, other):
    a, b = base().with_batch(batch), base().with_batch(other)
    assert a.shape_key() == b.shape_key()
    assert (a.key == b.key) == (batch == other)
    assert a.key.endswith(f"|n={batch}")
    assert a.batch == batch and a.x_shape[1:] == BASE["x_shape"][1:]


def test_with_kind_and_with_batch():
    p = base()
    assert p.with_kind("BD").kind is ConvKind.BACKWARD_DATA
    assert p.with_kind(ConvKind.BACKWARD_FILTER).key.startswith("BF|")
    q = p.with_batch(3)
    assert q.x_shape == (3, 6, 14, 12) and q.y_shape[0] == 3 and q.w_shape == p.w_shape
    assert replace(q, x_shape=p.x_shape) == p


def test_kind_str():
    assert [str(k) for k in ConvKind] == ["F", "BD", "BF"]


# ------------------------------------------------------------------------------------- y_shape

@pytest.mark.parametrize("x, w, pads, strides, dil, y", [
    ((2, 3, 7, 9), (4, 3, 3, 3), (1, 0), (2, 1), (1, 2), (2, 4, 4, 5)),
    ((1, 1, 5, 5), (1, 1, 3, 3), (0, 0), (1, 1), (1, 1), (1, 1, 3, 3)),
    ((1, 1, 5, 5), (1, 1, 3, 3), (1, 1), (1, 1), (1, 1), (1, 1, 5, 5)),
    ((1, 1, 5, 5), (1, 1, 5, 5), (0, 0), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((32, 3, 224, 224), (64, 3, 7, 7), (3, 3), (2, 2), (1, 1), (32, 64, 112, 112)),  # ResNet conv1
    ((4, 2, 10), (3, 2, 4), (1,), (3,), (2,), (4, 3, 2)),  # 1-D
    ((1, 2, 5, 6, 7), (2, 2, 3, 1, 2), (1, 0, 0), (1, 2, 3), (1, 1, 2), (1, 2, 5, 3, 2)),  # 3-D
])
def test_y_shape_examples(x, w, pads, strides, dil, y):
    p = ConvProblem("F", x, w, pads=pads, strides=strides, dilations=dil)
    assert p.y_shape == y
    assert p.spatial_dims == len(x) - 2


def _positions(size, ker, pad, stride, dil) -> int:
    """How many window starts fit, counted one by one."""
    return sum(1 for o in range(size + 2 * pad + 1) if o * stride + dil * (ker - 1) < size + 2 * pad)


@st.composite
def problems(draw, max_dims=3):
    nd = draw(st.integers(1, max_dims))
    groups = draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    dil = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    pads = draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd))
    strides = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    sizes = [draw(st.integers(max(1, d * (k - 1) + 1 - 2 * q), 20)) for k, d, q in zip(kernel, dil, pads)]
    cg = draw(st.integers(1, 3))
    k = groups * draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    return ConvProblem(
        kind=draw(st.sampled_from(list(ConvKind))), x_shape=(draw(st.integers(1, 64)), cg * groups, *sizes),
        w_shape=(k, cg, *kernel), pads=pads, strides=strides, dilations=dil, groups=groups, dtype=dtype,
        compute_type=draw(st.sampled_from(["", dtype, "float32"])), math=draw(st.sampled_from(MATH_TYPES)),
        layout=draw(st.sampled_from(LAYOUTS)), mode=draw(st.sampled_from(MODES)),
        deterministic=draw(st.booleans()),
    )


@settings(max_examples=150)
@given(problems())
def test_y_shape_counts_window_positions(p):
    expected = tuple(_positions(*a) for a in zip(p.x_shape[2:], p.w_shape[2:], p.pads, p.strides, p.dilations))
    assert p.y_shape == (p.batch, p.w_shape[0], *expected)
    assert p.sample_bytes("x") == int(np.prod(p.x_shape[1:])) * ITEMSIZE[p.dtype]
    assert p.sample_bytes("y") == int(np.prod(p.y_shape[1:])) * p.itemsize


@settings(max_examples=150)
@given(problems())
def test_dict_round_trip(p):
    d = p.to_dict()
    assert all(isinstance(v, (str, int, list, type(None))) for v in d.values())
    assert d["kind"] in ("F", "BD", "BF")
    assert ("deterministic" in d) == p.deterministic  # absent when False, as in rows of older versions
    back = ConvProblem.from_dict(json.loads(json.dumps(d)))
    assert back == p and back.key == p.key
    assert ConvProblem.from_dict(d) == p


def test_to_dict_fields():
    d = base().to_dict()
    assert d == {**BASE, "x_shape": [8, 6, 14, 12], "w_shape": [4, 3, 3, 3], "pads": [1, 0],
                 "strides": [2, 1], "dilations": [1, 2]}


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_default_pads_strides_dilations_fit_any_dimension(nd):
    p = ConvProblem("F", (2, 3, *[6] * nd), (4, 3, *[3] * nd))
    assert p.pads == (0,) * nd and p.strides == (1,) * nd and p.dilations == (1,) * nd
    assert p.y_shape == (2, 4, *[4] * nd)


def test_flops():
    p = ConvProblem("F", (2, 4, 5, 5), (6, 2, 3, 3), groups=2)
    assert p.flops() == 2 * (2 * 6 * 3 * 3) * 2 * 9
    assert p.with_kind("BF").flops() == p.flops()


# ---------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("changes, needle", [
    (dict(groups=0), "groups=0"),
    (dict(groups=-2), "groups=-2"),
    (dict(groups=4), "groups=4"),  # 6 channels, 3 per group: 3 * 4 != 6
    (dict(groups=3, x_shape=(8, 9, 14, 12), w_shape=(4, 3, 3, 3)), "groups=3"),  # K=4 not divisible
    (dict(groups=1), "groups=1"),  # w has 3 channels, x has 6
    (dict(w_shape=(4, 3, 20, 3)), "empty"),
    (dict(x_shape=(8, 6, 2, 12), pads=(0, 0)), "empty"),
    (dict(dilations=(8, 2)), "empty"),
    (dict(dtype="int8"), "'int8'"),
    (dict(dtype="float"), "'float'"),
    (dict(compute_type="int32"), "'int32'"),
    (dict(layout="nchw_vect_c"), "'nchw_vect_c'"),
    (dict(layout="NCHW"), "'NCHW'"),
    (dict(math="tf32"), "'tf32'"),
    (dict(mode="correlation"), "'correlation'"),
    (dict(kind="forward"), "'forward'"),
    (dict(kind="X"), "'X'"),
    (dict(pads=(1, 0, 0)), "pads"),
    (dict(strides=(1,)), "strides"),
    (dict(dilations=(1, 1, 1)), "dilations"),
    (dict(pads=(-1, 0)), "pads=(-1, 0) must be >= 0 in every dimension"),
    (dict(strides=(0, 1)), "strides=(0, 1) must be >= 1 in every dimension"),
    (dict(dilations=(1, 0)), "dilations=(1, 0) must be >= 1 in every dimension"),
    (dict(x_shape=(0, 6, 14, 12)), "x_shape=(0, 6, 14, 12) must be >= 1 in every dimension"),
    (dict(x_shape=(8, 6, 14, 0)), "x_shape=(8, 6, 14, 0) must be >= 1"),
    (dict(w_shape=(0, 3, 3, 3)), "w_shape=(0, 3, 3, 3) must be >= 1"),
    (dict(x_shape=(8, 6, 14)), "x_shape"),
    (dict(x_shape=(8, 6), w_shape=(4, 3)), "x_shape"),
])
def test_validation_errors(changes, needle):
    with pytest.raises(ConfigError) as info:
        base(**changes)
    assert needle in str(info.value) and "ConvProblem(" not in str(info.value)


@pytest.mark.parametrize("field, value", [("dtype", "int8"), ("layout", "chwn"), ("math", "x"), ("mode", "y")])
def test_unknown_choice_lists_the_accepted_ones(field, value):
    choices = {"dtype": DTYPES, "layout": LAYOUTS, "math": MATH_TYPES, "mode": MODES}[field]
    with pytest.raises(ConfigError) as info:
        base(**{field: value})
    for choice in choices:
        assert choice in str(info.value)


@pytest.mark.parametrize("dtype, math", [("float32", "default"), ("float64", "default"),
                                         ("float16", "tensor_op"), ("bfloat16", "tensor_op")])
def test_math_defaults_per_dtype(dtype, math):
    """Half types run on tensor cores only with tensor-op math; float32 keeps `default` (TF32
    where allowed). An explicit math type is kept."""
    assert base(dtype=dtype, math="").math == math == default_math(dtype)
    assert ConvProblem("F", (2, 3, 8, 8), (4, 3, 3, 3), dtype=dtype).math == math
    assert base(dtype=dtype, math="fma").math == "fma"
    assert replace(base(dtype=dtype, math=""), x_shape=(4, 6, 14, 12)).math == math


def test_network_kernels_use_the_default_math_of_their_dtype():
    from ucudnn.core.nets import get_network

    net = get_network("alexnet")
    assert {k.problem.math for k in net.problems(32, "float16", layout="nhwc")} == {"tensor_op"}
    assert {k.problem.math for k in net.problems(32, "bfloat16")} == {"tensor_op"}
    assert {k.problem.math for k in net.problems(32)} == {"default"}
    assert {k.problem.math for k in net.problems(32, "float16", "default")} == {"default"}


def test_problem_is_immutable():
    with pytest.raises(AttributeError):
        base().groups = 1  # type: ignore[misc]
