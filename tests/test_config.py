"""Settings: size strings, batch-size policies, and the kwargs > UCUDNN_* env > defaults precedence."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from ucudnn.core.errors import ConfigError
from ucudnn.plan.config import POLICIES, SIZE_FORMS, Settings, batch_sizes, format_size, parse_size

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


# ---------------------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("text, expected", [
    ("64MiB", 64 * MiB),
    ("1.5GiB", 3 * GiB // 2),
    ("512KiB", 512 * KiB),
    ("1GB", 10**9),
    ("1048576", 1048576),
    ("0", 0),
    ("64 MiB", 64 * MiB),
    ("  64mib  ", 64 * MiB),
    ("64M", 64 * MiB),
    ("2k", 2 * KiB),
    ("3kB", 3000),
    ("5MB", 5 * 10**6),
    ("2TiB", 2 * TiB),
    ("1TB", 10**12),
    ("7b", 7),
    ("1.", 1),
    (".5KiB", 512),
    ("0.25MiB", MiB // 4),
    # Above 2**53 a float cannot hold every integer: the byte count must stay exact.
    ("9007199254740993", 2**53 + 1),
    ("9223372036854775807", 2**63 - 1),  # int64's largest: the largest size
    (0, 0),
    (4096, 4096),
    (64 * MiB, 64 * MiB),
])
def test_parse_size_accepts(text, expected):
    size = parse_size(text)
    assert size == expected
    assert type(size) is int


@pytest.mark.parametrize("bad", [
    "-1", "64XB", "1.5", "0.3", "", "   ", True, False, -1, -4096, "abc", "1.5.2", "1e6",
    "MiB", "64 Mi B", "0x10", None, "1,024", "1.0000001KiB",
])
def test_parse_size_rejects_and_names_value_and_forms(bad):
    with pytest.raises(ConfigError) as info:
        parse_size(bad, name="workspace_limit")
    message = str(info.value)
    assert "workspace_limit" in message
    assert (repr(bad) in message) or (str(bad) in message)
    assert SIZE_FORMS in message
    for example in ("64MiB", "1.5GiB", "1GB"):
        assert example in message


def test_parse_size_fraction_error_says_whole_bytes():
    with pytest.raises(ConfigError, match="whole number of bytes"):
        parse_size("1.5")


_UNIT_SCALES = {"": 1, "B": 1, "K": KiB, "KiB": KiB, "KB": 10**3, "M": MiB, "MiB": MiB,
                "MB": 10**6, "G": GiB, "GiB": GiB, "GB": 10**9, "T": TiB, "TiB": TiB, "TB": 10**12}


@settings(max_examples=100)
@given(n=st.integers(0, 10**6), unit=st.sampled_from(sorted(_UNIT_SCALES)), lower=st.booleans(),
       space=st.sampled_from(["", " "]))
def test_parse_size_integer_with_any_unit(n, unit, lower, space):
    text = f"{n}{space}{unit.lower() if lower else unit}"
    assert parse_size(text) == n * _UNIT_SCALES[unit]


@settings(max_examples=100)
@given(n=st.integers(0, 2**63 - 1))
def test_parse_size_plain_and_int_round_trip(n):
    assert parse_size(str(n)) == n
    assert parse_size(n) == n


@pytest.mark.parametrize("size", [2**63, "8388608TiB", "9223372036854775808", "99999999999999999999999TiB"])
def test_parse_size_refuses_more_than_int64_holds(size):
    with pytest.raises(ConfigError, match=r"workspace_limit=.* is more than int64 holds \(9223372036854775807 bytes\)"):
        parse_size(size, name="workspace_limit")


@settings(max_examples=50)
@given(quarters=st.integers(0, 400), unit=st.sampled_from(["KiB", "MiB", "GiB"]))
def test_parse_size_decimal_fractions_of_binary_units(quarters, unit):
    text = f"{quarters // 4}.{(quarters % 4) * 25:02d}{unit}"
    assert parse_size(text) == quarters * _UNIT_SCALES[unit] // 4


@pytest.mark.parametrize("nbytes, text", [
    (64 * MiB, "64.0 MiB"), (3 * GiB // 2, "1.5 GiB"), (512 * KiB, "512.0 KiB"), (512, "512 B"), (0, "0 B"),
])
def test_format_size(nbytes, text):
    assert format_size(nbytes) == text


# ------------------------------------------------------------------------------ batch-size policy

@pytest.mark.parametrize("policy, batch, expected", [
    ("all", 1, (1,)),
    ("all", 5, (1, 2, 3, 4, 5)),
    ("powerOfTwo", 1, (1,)),
    ("powerOfTwo", 2, (1, 2)),
    ("powerOfTwo", 64, (1, 2, 4, 8, 16, 32, 64)),
    ("powerOfTwo", 97, (1, 2, 4, 8, 16, 32, 64, 97)),
    ("powerOfTwo", 250, (1, 2, 4, 8, 16, 32, 64, 128, 250)),
    ("powerOfTwo", 256, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
    ("powerOfTwo", 6, (1, 2, 4, 6)),
    ("undivided", 1, (1,)),
    ("undivided", 97, (97,)),
    ("undivided", 256, (256,)),
])
def test_batch_sizes_examples(policy, batch, expected):
    assert batch_sizes(policy, batch) == expected


@settings(max_examples=200)
@given(batch=st.integers(1, 5000))
def test_batch_sizes_properties(batch):
    every = batch_sizes("all", batch)
    assert every == tuple(range(1, batch + 1))
    assert batch_sizes("undivided", batch) == (batch,)
    powers = batch_sizes("powerOfTwo", batch)
    assert list(powers) == sorted(set(powers))  # ascending, no duplicates
    assert powers[-1] == batch and powers[0] == 1
    assert {b for b in powers if b != batch} == {2**i for i in range(batch.bit_length()) if 2**i < batch}
    assert set(powers) <= set(every)


@pytest.mark.parametrize("policy", ["pow2", "power_of_two", "", "ALL", None, "undivided "])
def test_batch_sizes_bad_policy(policy):
    with pytest.raises(ConfigError) as info:
        batch_sizes(policy, 8)
    message = str(info.value)
    assert repr(policy) in message
    for known in POLICIES:
        assert known in message


@pytest.mark.parametrize("batch", [0, -1, 2.0, 2.5, "8", True, None])
def test_batch_sizes_bad_batch(batch):
    for policy in POLICIES:
        with pytest.raises(ConfigError) as info:
            batch_sizes(policy, batch)
        assert repr(batch) in str(info.value)


# --------------------------------------------------------------------------------------- Settings

DEFAULTS = dict(policy="powerOfTwo", workspace_limit=64 * MiB, total_limit=None,
                optimizer="wr", execution="graph", verbose=False, cache_path=None)

# Every setting: its env variable, a raw env value, what it parses to, a different kwarg and its value.
CASES = {
    "policy": ("UCUDNN_POLICY", "all", "all", "undivided", "undivided"),
    "workspace_limit": ("UCUDNN_WORKSPACE_LIMIT", "8MiB", 8 * MiB, "512KiB", 512 * KiB),
    "total_limit": ("UCUDNN_TOTAL_LIMIT", "1.5GiB", 3 * GiB // 2, 2 * GiB, 2 * GiB),
    "optimizer": ("UCUDNN_OPTIMIZER", "WD", "wd", "wd", "wd"),  # not wr: every case here has a total
    "execution": ("UCUDNN_EXECUTION", "direct", "direct", "graph", "graph"),
    "verbose": ("UCUDNN_VERBOSE", "1", True, False, False),
    "cache_path": ("UCUDNN_CACHE", "/tmp/env.db", "/tmp/env.db", "/tmp/kw.db", "/tmp/kw.db"),
}


def _values(s: Settings) -> dict:
    return {name: getattr(s, name) for name in DEFAULTS}


def test_cases_cover_every_setting():
    assert set(CASES) == set(DEFAULTS) == set(_values(Settings()))


def test_defaults_without_env_or_kwargs():
    assert _values(Settings.load(env={})) == DEFAULTS
    assert Settings.load(env={}) == Settings()


def test_env_sets_every_value():
    env = {var: raw for var, raw, *_ in CASES.values()}
    assert _values(Settings.load(env=env)) == {name: case[2] for name, case in CASES.items()}


def test_kwargs_win_over_env():
    """Every setting's argument at once, but for the per-kernel limit, which beside a total is an
    error (test_both_limits_given_are_an_error_naming_both); the per-kernel one's test_precedence_per_setting."""
    env = {var: raw for var, raw, *_ in CASES.values()}
    kwargs = {name: case[3] for name, case in CASES.items() if name != "workspace_limit"}
    expected = {name: case[4] for name, case in CASES.items()} | {"workspace_limit": 8 * MiB}
    assert _values(Settings.load(env=env, **kwargs)) == expected


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("source", ["default", "env", "kwarg", "both"])
def test_precedence_per_setting(name, source):
    var, raw, parsed, kwarg, kwarg_parsed = CASES[name]
    env = {var: raw} if source in ("env", "both") else {}
    kwargs = {name: kwarg} if source in ("kwarg", "both") else {}
    expected = dict(DEFAULTS)
    expected[name] = {"default": DEFAULTS[name], "env": parsed, "kwarg": kwarg_parsed,
                      "both": kwarg_parsed}[source]
    if name == "total_limit" and source != "default":
        expected["optimizer"] = "wd"  # a total means WD
    assert _values(Settings.load(env=env, **kwargs)) == expected


@pytest.mark.parametrize("env, kwargs", [
    ({"UCUDNN_TOTAL_LIMIT": "0"}, {}),
    ({}, {"total_limit": 0}),
    ({"UCUDNN_TOTAL_LIMIT": "1GiB"}, {"optimizer": None}),
])
def test_a_total_limit_means_wd(env, kwargs):
    assert Settings.load(env=env, **kwargs).optimizer == "wd"


@pytest.mark.parametrize("env, kwargs, message", [
    ({}, {"total_limit": "0", "optimizer": "wr"}, "total_limit='0' is the WD optimizer's limit, but optimizer='wr'"),
    ({"UCUDNN_TOTAL_LIMIT": "1GiB", "UCUDNN_OPTIMIZER": "WR"}, {},
     "UCUDNN_TOTAL_LIMIT='1GiB' is the WD optimizer's limit, but UCUDNN_OPTIMIZER='WR' plans each kernel alone"),
])
def test_a_total_limit_with_wr_is_an_error_naming_where_each_was_set(env, kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.load(env=env, **kwargs)


@pytest.mark.parametrize("env, kwargs, expected", [
    # a per-kernel limit or optimizer given: a total from the environment would contradict it
    ({"UCUDNN_TOTAL_LIMIT": "120MiB"}, {"workspace_limit": "1MiB"}, ("wr", MiB, None)),
    ({"UCUDNN_TOTAL_LIMIT": "120MiB"}, {"optimizer": "wr"}, ("wr", 64 * MiB, None)),
    ({"UCUDNN_TOTAL_LIMIT": "120MiB", "UCUDNN_OPTIMIZER": "wd"}, {"workspace_limit": "1MiB"}, ("wd", MiB, None)),
    # a total given: a per-kernel optimizer from the environment would contradict it
    ({"UCUDNN_OPTIMIZER": "wr"}, {"total_limit": "0"}, ("wd", 64 * MiB, 0)),
    # no contradiction: the variable stays
    ({"UCUDNN_TOTAL_LIMIT": "120MiB"}, {"optimizer": "wd"}, ("wd", 64 * MiB, 120 * MiB)),
    ({"UCUDNN_TOTAL_LIMIT": "120MiB"}, {"policy": "all"}, ("wd", 64 * MiB, 120 * MiB)),
])
def test_an_argument_wins_over_a_variable_that_contradicts_it(env, kwargs, expected):
    """`ucudnn optimize --workspace 1MiB` with UCUDNN_TOTAL_LIMIT set planned WD at the variable's
    total, ignoring the flag: an argument wins over the variables, its own and those it contradicts."""
    s = Settings.load(env=env, **kwargs)
    assert (s.optimizer, s.workspace_limit, s.total_limit) == expected


def test_none_kwarg_means_not_given():
    env = {"UCUDNN_WORKSPACE_LIMIT": "8MiB", "UCUDNN_OPTIMIZER": "wd"}
    s = Settings.load(env=env, workspace_limit=None, optimizer=None, verbose=None)
    assert (s.workspace_limit, s.optimizer, s.verbose) == (8 * MiB, "wd", False)


def test_process_environment_is_read_by_default(monkeypatch):
    for case in CASES.values():
        monkeypatch.delenv(case[0], raising=False)
    monkeypatch.delenv("UCUDNN_CACHE_PATH", raising=False)
    monkeypatch.setenv("UCUDNN_WORKSPACE_LIMIT", "32MiB")
    monkeypatch.setenv("UCUDNN_POLICY", "undivided")
    s = Settings.load()
    assert s.workspace_limit == 32 * MiB and s.policy == "undivided"
    assert Settings.load(workspace_limit="1MiB").workspace_limit == MiB


@pytest.mark.parametrize("env", [{"UCUDNN_CACHE_PATH": "/tmp/x.db"},
                                 {"UCUDNN_CACHE_PATH": "/tmp/x.db", "UCUDNN_CACHE": "/tmp/y.db"}])
def test_ucudnn_cache_path_is_refused_naming_the_variable_that_is_read(env):
    """UCUDNN_CACHE_PATH, documented nowhere, chose the database where UCUDNN_CACHE was unset and
    was silently ignored where both were set."""
    with pytest.raises(ConfigError, match=r"^UCUDNN_CACHE_PATH='/tmp/x.db' is not read: [^\n]* is UCUDNN_CACHE"):
        Settings.load(env=env)


def test_unrelated_env_is_ignored():
    env = {"UCUDNN_SOMETHING_ELSE": "x", "PATH": "/bin", "WORKSPACE_LIMIT": "1"}
    assert Settings.load(env=env) == Settings()


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "On", " on "])
def test_verbose_true_flags(text):
    assert Settings.load(env={"UCUDNN_VERBOSE": text}).verbose is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "OFF", ""])
def test_verbose_false_flags(text):
    assert Settings.load(env={"UCUDNN_VERBOSE": text}, verbose=None).verbose is False
    assert Settings.load(env={"UCUDNN_VERBOSE": "1"}, verbose=text).verbose is False


@pytest.mark.parametrize("raw, expected", [
    ("POWEROFTWO", "powerOfTwo"), ("poweroftwo", "powerOfTwo"), ("All", "all"), ("UNDIVIDED", "undivided"),
])
def test_policy_names_are_case_insensitive(raw, expected):
    assert Settings.load(env={"UCUDNN_POLICY": raw}).policy == expected
    assert Settings.load(env={}, policy=raw).policy == expected


def test_optimizer_is_case_insensitive():
    assert Settings.load(env={"UCUDNN_OPTIMIZER": "WD"}).optimizer == "wd"


def test_every_unknown_choice_says_the_same():
    """One rule for a value that is none of its choices, wherever it is read."""
    from ucudnn.core.device import check_execution
    from ucudnn.core.problem import ConvProblem

    expected = "'most' is unknown; use one of all, powerOfTwo, undivided"
    for read in (lambda: Settings.load(env={"UCUDNN_POLICY": "most"}),
                 lambda: Settings.load(env={}, policy="most"), lambda: batch_sizes("most", 8)):
        with pytest.raises(ConfigError, match=f"=?{expected}"):
            read()
    with pytest.raises(ConfigError, match="execution='eager' is unknown; use one of graph, direct"):
        check_execution("eager")
    with pytest.raises(ConfigError, match="layout='chwn' is unknown; use one of nchw, nhwc"):
        ConvProblem("F", (1, 1, 4, 4), (1, 1, 3, 3), layout="chwn")


@pytest.mark.parametrize("var, bad", [
    ("UCUDNN_POLICY", "pow2"),
    ("UCUDNN_WORKSPACE_LIMIT", "lots"),
    ("UCUDNN_WORKSPACE_LIMIT", "-1"),
    ("UCUDNN_WORKSPACE_LIMIT", "64XB"),
    ("UCUDNN_TOTAL_LIMIT", "1.5"),
    ("UCUDNN_OPTIMIZER", "ilp"),
    ("UCUDNN_EXECUTION", "eager"),
    ("UCUDNN_VERBOSE", "maybe"),
])
def test_bad_env_value_names_value(var, bad):
    with pytest.raises(ConfigError) as info:
        Settings.load(env={var: bad})
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("name, bad", [
    ("policy", "pow2"),
    ("workspace_limit", "lots"),
    ("workspace_limit", -5),
    ("workspace_limit", True),
    ("total_limit", "64XB"),
    ("optimizer", "ilp"),
    ("verbose", "perhaps"),
])
def test_bad_kwarg_names_value_and_setting(name, bad):
    with pytest.raises(ConfigError) as info:
        Settings.load(env={}, **{name: bad})
    message = str(info.value)
    assert name in message
    assert str(bad) in message


def test_bad_kwarg_wins_over_good_env_and_still_raises():
    with pytest.raises(ConfigError, match="ilp"):
        Settings.load(env={"UCUDNN_OPTIMIZER": "wd"}, optimizer="ilp")


def test_good_kwarg_hides_bad_env():
    assert Settings.load(env={"UCUDNN_OPTIMIZER": "ilp"}, optimizer="wd").optimizer == "wd"


def test_unknown_kwarg_is_named():
    with pytest.raises(ConfigError) as info:
        Settings.load(env={}, workspace=5)
    assert "workspace" in str(info.value) and "workspace_limit" in str(info.value)


def test_settings_are_immutable():
    s = Settings.load(env={})
    with pytest.raises(AttributeError):
        s.workspace_limit = 1  # type: ignore[misc]


@pytest.mark.parametrize("variable, value", [("UCUDNN_POLICY", "foo"), ("UCUDNN_WORKSPACE_LIMIT", "64XB"),
                                             ("UCUDNN_OPTIMIZER", "best"), ("UCUDNN_VERBOSE", "maybe")])
def test_an_env_error_names_the_variable_the_user_set(variable, value):
    with pytest.raises(ConfigError) as raised:
        Settings.load(env={variable: value})
    assert str(raised.value).startswith(f"{variable}={value!r}")


def test_a_keyword_error_names_the_keyword():
    with pytest.raises(ConfigError, match="^policy='foo'"):
        Settings.load(env={}, policy="foo")


def test_the_solver_setting_names_an_ilp_solver_or_none():
    """UCUDNN_SOLVER picks WD's ILP solver (ucudnn.optimizers.solvers); unset, the first installed."""
    assert Settings.load(env={}).solver == ""
    assert Settings.load(env={"UCUDNN_SOLVER": "HiGHS"}).solver == "highs"
    assert Settings.load(env={"UCUDNN_SOLVER": "glpk"}, solver="cbc").solver == "cbc"
    with pytest.raises(ConfigError, match="UCUDNN_SOLVER='gurobi' is unknown; use one of cbc, highs, glpk"):
        Settings.load(env={"UCUDNN_SOLVER": "gurobi"})


# ------------------------------------------------ limits from a memory timeline, delegation

@pytest.mark.parametrize("env, kwargs, expected", [
    # (auto, optimizer, workspace_limit, total_limit) as ucudnn.torch reads them (timeline=True)
    ({}, {}, (True, "wr", 64 * MiB, None)),  # the default: limits from the timeline
    ({"UCUDNN_WORKSPACE_LIMIT": "AUTO", "UCUDNN_TOTAL_LIMIT": "auto"}, {}, (True, "wr", 64 * MiB, None)),
    ({}, {"total_limit": "auto", "optimizer": "wd"}, (True, "wr", 64 * MiB, None)),  # WD's division is the same
    ({}, {"workspace_limit": "auto", "total_limit": "auto"}, (True, "wr", 64 * MiB, None)),
    ({"UCUDNN_TOTAL_LIMIT": "1GiB"}, {"workspace_limit": "auto"}, (True, "wr", 64 * MiB, None)),
    ({"UCUDNN_WORKSPACE_LIMIT": "32MiB"}, {"total_limit": "auto"}, (True, "wr", 64 * MiB, None)),
    ({"UCUDNN_OPTIMIZER": "wr"}, {"total_limit": "auto"}, (True, "wr", 64 * MiB, None)),  # the argument wins
    ({}, {"workspace_limit": "8MiB"}, (False, "wr", 8 * MiB, None)),  # a size is a fixed limit
    ({"UCUDNN_WORKSPACE_LIMIT": "32MiB"}, {}, (False, "wr", 32 * MiB, None)),
    ({"UCUDNN_WORKSPACE_LIMIT": "auto"}, {"workspace_limit": "8MiB"}, (False, "wr", 8 * MiB, None)),
    ({}, {"optimizer": "wd"}, (False, "wd", 64 * MiB, None)),  # the paper's WD: a total of limits
    ({"UCUDNN_WORKSPACE_LIMIT": "auto"}, {"optimizer": "wd"}, (False, "wd", 64 * MiB, None)),
    ({"UCUDNN_WORKSPACE_LIMIT": "auto", "UCUDNN_TOTAL_LIMIT": "1GiB"}, {}, (False, "wd", 64 * MiB, GiB)),
])
def test_with_a_timeline_limits_come_from_it_where_asked_or_by_default(env, kwargs, expected):
    s = Settings.load(env=env, timeline=True, **kwargs)
    assert (s.auto, s.optimizer, s.workspace_limit, s.total_limit) == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"total_limit": "auto", "optimizer": "wr"},
     "total_limit='auto' is the WD optimizer's limit, but optimizer='wr' plans each kernel alone"),
    ({"total_limit": "auto", "workspace_limit": "64MiB"}, "workspace_limit is not used beside total_limit"),
    ({"total_limit": "1GiB", "workspace_limit": "auto"}, "give one of them"),
])
def test_auto_limits_refuse_what_contradicts_them_as_sizes_do(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.load(env={}, timeline=True, **kwargs)


def test_without_a_timeline_a_limit_variable_of_auto_is_unset_and_an_argument_an_error():
    """The handle and the CLI have no training step: UCUDNN_*_LIMIT=auto (ucudnn.torch's default,
    set for a whole job) leaves their defaults; workspace_limit='auto' given is an error naming it."""
    env = {"UCUDNN_WORKSPACE_LIMIT": "auto", "UCUDNN_TOTAL_LIMIT": "auto"}
    assert Settings.load(env=env) == Settings()
    for name in ("workspace_limit", "total_limit"):
        with pytest.raises(ConfigError, match=f"{name}='auto' asks for limits from the memory timeline.*give a size"):
            Settings.load(env={}, **{name: "auto"})


def test_auto_and_delegate_are_settings_no_variable_sets():
    from ucudnn.plan.config import variables

    assert (Settings().auto, Settings().delegate) == (False, True)
    assert Settings.load(env={"UCUDNN_DELEGATE": "0", "UCUDNN_AUTO": "1"}) == Settings()
    assert Settings.load(env={}, delegate="off").delegate is False
    assert not {"UCUDNN_AUTO", "UCUDNN_DELEGATE"} & set(variables())
    with pytest.raises(ConfigError, match="auto is what the limits say: pass workspace_limit='auto'"):
        Settings.load(env={}, auto=True)


def test_a_torch_option_given_to_settings_names_where_it_goes():
    with pytest.raises(ConfigError, match=r"concurrent_backward is ucudnn.torch's .*convert\(\)"):
        Settings.load(env={}, concurrent_backward=True)


def test_settings_load_without_sqlite_utils(tmp_path):
    """A size parser and the settings need no SQLite library: `import ucudnn` and Settings.load work
    where sqlite_utils cannot be imported (the cache's variable lives apart: ucudnn.measure.variables)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.modules['sqlite_utils'] = None\n"
            "import ucudnn\n"
            "from ucudnn.plan.config import Settings, parse_size\n"
            "assert parse_size('64MiB') == 2**26\n"
            "assert Settings.load(env={'UCUDNN_CACHE': '/tmp/x.db'}, policy='all').cache_path == '/tmp/x.db'\n"
            "assert 'ucudnn.measure.cache' not in sys.modules, 'the cache package was imported'\n"
            "try:\n"
            "    import sqlite_utils\n"
            "except ImportError:\n"
            "    print('refused')\n")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
