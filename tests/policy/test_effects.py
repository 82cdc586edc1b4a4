"""Valid policies that quietly disable the product are warned, and the what-if shows why.

Generated thresholds, reserves and exit budgets go through ``gpupool validate``: it exits 0,
and prints one ``FILE:LINE: warning: FIELD: ...`` line naming the field and the effect
exactly when the value keeps flex from growing, sheds it at once, reserves nearly every GPU
or keeps production pending for minutes. Then the what-if engine replays the bundled traces
with one such policy per warning, against the shipped policy: the effect the warning names is
measured there (flex harvests next to nothing; production waits minutes).
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from policy.effects import GROW_BELOW_MIN, PROD_WAIT_MAX_S, RESERVE_SHARE_MAX, SHED_ABOVE_MIN
from runtime.cli.app import app
from tests.harness.hostile import yaml_round_trips
from tests.infra.policies import edited
from tests.infra.test_cli import write_policy

runner = CliRunner()


def _validate(edits: dict[str, Any], drawn: bool = True) -> tuple[int, list[str]]:
    """Exit code and output lines of ``gpupool validate`` on the default with ``edits``
    (``drawn``: by hypothesis, which drops values no YAML file holds)."""
    doc = edited(edits)
    if drawn:
        yaml_round_trips(doc)
    with tempfile.TemporaryDirectory() as folder:
        source = write_policy(Path(folder), doc)
        result = runner.invoke(app, ["validate", str(source)])
        assert "Traceback" not in result.output, result.output
        lines = result.output.strip().splitlines()
        return result.exit_code, [re.sub(r"^[^:]+:[0-9]+: ", "", line) for line in lines]


def _warned(lines: list[str], field: str) -> list[str]:
    return [line for line in lines if line.startswith(f"warning: {field}: ")]


fractions = st.one_of(
    st.floats(0, 1), st.sampled_from([0.0, 0.001, 0.01, 0.049, 0.05, 0.099, 0.1, 0.35, 0.65])
)


@pytest.mark.heavy
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grow=fractions, shed=fractions)
@example(grow=0.0, shed=0.65)
@example(grow=0.0005, shed=0.001)
def test_a_band_that_never_grows_or_always_sheds_is_warned(grow: float, shed: float) -> None:
    code, lines = _validate(
        {
            "elastic.grow_while_production_below": grow,
            "elastic.shed_while_production_above": shed,
        }
    )
    if grow >= shed:
        assert code == 1  # the band's own rule
        return
    assert code == 0, lines
    grows = _warned(lines, "elastic.grow_while_production_below")
    sheds = _warned(lines, "elastic.shed_while_production_above")
    assert bool(grows) == (grow < GROW_BELOW_MIN), lines
    assert bool(sheds) == (shed < SHED_ABOVE_MIN), lines
    assert all("flex" in line and "expected" in line for line in grows + sheds)


@pytest.mark.heavy
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prod=fractions, flex=st.floats(0, 0.99))
@example(prod=0.9, flex=0.9)
def test_reserving_most_of_a_pool_is_warned(prod: float, flex: float) -> None:
    edits = {"node_pools.0.reserve_ratio": prod, "node_pools.1.reserve_ratio": flex}
    code, lines = _validate({**edits, "production": []})
    assert code == 0, lines
    for i, ratio, gpus in ((0, prod, 64), (1, flex, 32)):  # gpu-prod 8 x 8, gpu-flex 4 x 8
        warned = _warned(lines, f"node_pools.{i}.reserve_ratio")
        kept = int(gpus * ratio)
        assert bool(warned) == (kept >= RESERVE_SHARE_MAX * gpus), (ratio, lines)
        assert all(f"keeps {kept} of the {gpus} GPUs" in line for line in warned), warned


@pytest.mark.heavy
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grace=st.integers(30, 3600), drain=st.integers(1, 3600))
@example(grace=3600, drain=3500)
def test_an_exit_that_keeps_production_pending_for_minutes_is_warned(
    grace: int, drain: int
) -> None:
    code, lines = _validate({"disruption.termination_grace_s": grace, "disruption.drain_s": drain})
    budget = 5 + drain + 10  # prestop_delay_s + drain_s + snapshot_s of the default
    if grace < budget:
        assert code == 1
        return
    assert code == 0, lines
    warned = _warned(lines, "disruption.termination_grace_s")
    assert bool(warned) == (grace > PROD_WAIT_MAX_S), lines
    assert all(f"{budget} s" in line and "production" in line for line in warned), warned


# --- measured: the what-if on the bundled traces -----------------------------------------

DISABLING = {
    "grow-never": ({"elastic.grow_while_production_below": 0.0}, 2),
    "shed-at-once": (
        {
            "elastic.grow_while_production_below": 0.0005,
            "elastic.shed_while_production_above": 0.001,
        },
        2,
    ),
    "reserve-90": (
        {"node_pools.0.reserve_ratio": 0.9, "node_pools.1.reserve_ratio": 0.9, "production": []},
        2,
    ),
    "drain-an-hour": ({"disruption.termination_grace_s": 3600, "disruption.drain_s": 3500}, 3),
}
"""One policy per warning, and the hours of trace that show its effect."""


@functools.cache
def _whatif(edits: str, hours: int) -> dict[str, Any]:
    """The pooled summary of ``gpupool whatif`` on the default with ``edits`` (JSON)."""
    with tempfile.TemporaryDirectory() as folder:
        source = write_policy(Path(folder), edited(json.loads(edits)))
        out = source.with_suffix(".json")
        args = ["whatif", "--policy", str(source), "--hours", str(hours), "--json", str(out)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        pooled: dict[str, Any] = json.loads(out.read_text())["pooled"]
        return pooled


@pytest.mark.parametrize("case", sorted(DISABLING))
def test_the_warned_effect_is_what_the_whatif_measures(case: str) -> None:
    edits, hours = DISABLING[case]
    code, lines = _validate(edits, drawn=False)
    assert code == 0 and any(line.startswith("warning: ") for line in lines), lines
    shipped = _whatif("{}", hours)
    warned = _whatif(json.dumps(edits), hours)
    if case == "drain-an-hour":
        # production waits minutes for the GPUs of preempted flex pods, never before
        assert shipped["checks"]["prod_wait_max_s"] <= 60
        assert warned["checks"]["prod_wait_max_s"] >= 120
        assert warned["prod_pending_pod_minutes"]["preemption"] > 0
    else:
        # flex harvests next to nothing of what the shipped policy harvests
        assert warned["harvested_gpu_h"] < 0.1 * shipped["harvested_gpu_h"], (
            warned["harvested_gpu_h"],
            shipped["harvested_gpu_h"],
        )
