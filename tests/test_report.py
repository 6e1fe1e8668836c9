"""Network reports from synthetic tables: WR and WD against their references."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ucudnn.core.errors import ConfigError
from ucudnn.core.nets import get_network
from ucudnn.optimizers.wr import optimize_wr
from ucudnn.plan.config import Settings
from ucudnn.plan.solve import measured_in, plan
from ucudnn.reports.report import make_report

import synthetic

MIB = 2**20


@pytest.fixture(scope="module")
def kernels():
    return get_network("resnet18").problems(32)


@pytest.fixture(scope="module")
def tables(kernels):
    return {k.problem.key: synthetic.table(k.problem) for k in kernels}


def report(kernels, tables, **settings):
    """The report of the plan that solve.plan makes from tables at hand."""
    given = Settings.load(env={}, **settings)
    return make_report(plan(kernels, given, measured_in(tables)), given)


def test_wr_plan_is_wr_per_kernel_beside_cudnns_choices(kernels, tables):
    p = report(kernels, tables, workspace_limit="8MiB")
    assert (p.optimizer, p.limit, p.kernel_limit) == ("wr", 8 * MIB, 8 * MIB)
    for row in p.rows:
        table = tables[row.kernel.problem.key]
        assert row.configuration == optimize_wr(table, 32, (1, 2, 4, 8, 16, 32), 8 * MIB)
        assert row.undivided == optimize_wr(table, 32, (32,), 8 * MIB)
        assert row.best == optimize_wr(table, 32, (32,), None)
        assert row.configuration.batch == 32 and row.configuration.workspace <= 8 * MIB
        assert row.configuration.time_ms <= row.undivided.time_ms  # undivided is one of WR's options
        assert row.best.time_ms <= row.undivided.time_ms
    assert p.time_ms() == pytest.approx(sum(r.kernel.count * r.configuration.time_ms for r in p.rows))
    assert p.workspace == sum(r.configuration.workspace for r in p.rows)
    assert p.speedup == pytest.approx(p.time_ms("undivided") / p.time_ms()) and p.speedup > 1
    assert p.gap_to_best == pytest.approx(p.time_ms() / p.time_ms("best"))


def test_undivided_policy_is_cudnn_itself(kernels, tables):
    p = report(kernels, tables, policy="undivided")
    assert p.speedup == pytest.approx(1.0)
    assert all(row.configuration == row.undivided for row in p.rows)


def test_wd_beats_wr_at_the_same_total(kernels, tables):
    wr = report(kernels, tables, workspace_limit="8MiB")
    wd = report(kernels, tables, workspace_limit="8MiB", optimizer="wd")
    assert (wd.limit, wd.kernel_limit) == (8 * MIB * len(kernels), 8 * MIB)
    assert wd.workspace <= wd.limit
    assert wd.time_ms() <= wr.time_ms() + 1e-9  # WR's answer is feasible for WD
    assert wd.solver["variables"] > 0 and wd.solver["solver"] == "cbc"


@pytest.mark.parametrize("optimizer", ["wr", "wd"])
def test_a_plan_refuses_two_kernels_of_one_name_for_every_optimizer(kernels, tables, optimizer):
    """WR planned two kernels of one name and different problems into one configuration, without
    a word; WD refused them: a plan refuses them whatever its optimizer, in WD's words."""
    twice = [kernels[0], replace(kernels[3], name=kernels[0].name)]
    with pytest.raises(ConfigError) as error:
        report(twice, tables, optimizer=optimizer)
    assert str(error.value) == (f"kernel names ['{kernels[0].name}'] occur more than once; give every kernel its "
                                "own name, or one kernel a count for identical occurrences")


def test_wd_with_an_explicit_total(kernels, tables):
    p = report(kernels, tables, optimizer="wd", total_limit="40MiB")
    assert (p.limit, p.kernel_limit) == (40 * MIB, 40 * MIB // len(kernels))
    assert sum(row.configuration.workspace for row in p.rows) <= p.workspace <= 40 * MIB


def test_plan_json_is_plain_and_consistent(kernels, tables):
    p = report(kernels, tables)
    data = json.loads(json.dumps(p.to_json()))
    assert len(data["kernels"]) == len(kernels)
    first = data["kernels"][0]
    assert first["name"] == "conv1/F" and first["kind"] == "F"
    assert sum(part["batch"] for part in first["configuration"]["micro"]) == 32
    assert {"algo", "batch", "time_ms", "workspace"} <= set(first["configuration"]["micro"][0])
    assert data["total"]["time_ms"] == pytest.approx(p.time_ms())
    assert data["total"]["speedup"] == pytest.approx(p.speedup)


def test_rows_by_name_and_the_slowest(kernels, tables):
    p = report(kernels, tables)
    assert p.row("conv1/BF").kernel.name == "conv1/BF"
    slowest = p.slowest()
    assert all(r.kernel.count * r.configuration.time_ms <= slowest.kernel.count * slowest.configuration.time_ms
               for r in p.rows)
    with pytest.raises(ConfigError, match="not in this network"):
        p.row("fc/F")


def test_wd_solves_with_the_settings_solver(kernels, tables):
    p = report(kernels, tables, optimizer="wd", total_limit="40MiB", solver="highs")
    assert p.solver["solver"] == "highs" and p.workspace <= 40 * MIB
