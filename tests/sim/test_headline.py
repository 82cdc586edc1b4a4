"""The what-if headline in one unit: useful GPU-hours, the harvest bound, production unharmed,
and how the report, the JSON, the console and the plots carry them.

Replays here are built from their series (``Series``), so each figure is known by hand: a
step is 15 s, 240 steps an hour.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from policy import DEFAULT_POLICY, PoolPolicy, load_policy
from runtime.cli import whatif_commands
from runtime.cli.whatif_options import OutputPaths
from runtime.sim import class_text, markdown, output
from runtime.sim.cluster_objects import Waiting
from runtime.sim.options import DEMO, build_whatif
from runtime.sim.replay_model import Layout, Replay, Series
from runtime.sim.report import ClassFigures, summarize
from runtime.sim.whatif import Result, run

STEP_S = 15.0
HOUR = 240
"""Steps in an hour."""


@pytest.fixture(scope="module")
def policy() -> PoolPolicy:
    return load_policy()


def _replay(
    name: str,
    *,
    total: list[int],
    prod_busy: list[float],
    flex_running: list[int],
    flex_duty: list[float],
    flex_gpus: list[int] | None = None,
    served: list[float] | None = None,
    prod_gpus: list[int] | None = None,
    flex_tokens: list[int] | None = None,
    pending: dict[Waiting, list[int]] | None = None,
    flex_by_pool: dict[str, list[int]] | None = None,
    capped: dict[str, list[bool]] | None = None,
    evictions: list[int] | None = None,
) -> Replay:
    """A replay with these per-step series (the rest 0); production holds ``prod_gpus``
    (default: ceil of its busy GPU-equivalents) and is served all it wants unless ``served``
    says otherwise; flex holds ``flex_gpus`` (default: its running GPUs)."""
    n = len(total)
    zeros = [0] * n
    held = prod_gpus or [math.ceil(b) for b in prod_busy]
    by_cause = pending or {}
    causes = {c: list(by_cause.get(c, zeros)) for c in Waiting}
    holding = flex_gpus or flex_running
    series = Series(
        t=[i * STEP_S for i in range(n)],
        prod_need=held,
        prod_gpus=held,
        prod_pending=[sum(v[i] for v in causes.values()) for i in range(n)],
        prod_pending_by_cause=causes,
        prod_busy_served=list(prod_busy if served is None else served),
        prod_busy=list(prod_busy),
        flex_gpus=list(holding),
        flex_running_gpus=list(flex_running),
        flex_pending=zeros,
        flex_duty=list(flex_duty),
        free_gpus=[t - h - f for t, h, f in zip(total, held, holding, strict=True)],
        total_gpus=list(total),
        evictions=evictions or zeros,
        flex_tokens=flex_tokens or zeros,
        self_shed=zeros,
        prod_wait_max_s=[0.0] * n,
        budget_over_free=zeros,
        flex_by_pool=flex_by_pool or {},
        capped=capped or {},
    )
    return Replay(name, STEP_S, series, {})


def _result(policy: PoolPolicy, pooled: Replay, fixed: Replay, reserve_gpus: int = 0) -> Result:
    layout = Layout({"gpu-prod": 1, "gpu-flex": 1}, {"gpu-prod": 8, "gpu-flex": 8}, {"w": 16})
    return Result(
        summarize(pooled, policy),
        summarize(fixed, policy),
        (pooled, fixed),
        layout,
        ("a constructed replay",),
        reserve_gpus=reserve_gpus,
    )


def _flat(value: float, n: int = HOUR) -> list[float]:
    return [value] * n


def _ints(value: int, n: int = HOUR) -> list[int]:
    return [value] * n


@pytest.fixture(scope="module")
def doubled(policy: PoolPolicy) -> Result:
    """16 GPUs for an hour; production busy on 4 in both replays; flex busy on 4 GPU-
    equivalents in the fixed topology (8 GPUs at half duty) and on 12 pooled (12 GPUs at full
    duty): useful GPU-hours 8 vs 16. Flex produces the same tokens in both."""
    common = {"total": _ints(16), "prod_busy": _flat(4.0), "flex_tokens": _ints(1_000)}
    fixed = _replay("fixed", flex_running=_ints(8), flex_duty=_flat(0.5), **common)  # type: ignore[arg-type]
    pooled = _replay(
        "pooled",
        flex_running=_ints(12),
        flex_duty=_flat(1.0),
        flex_by_pool={"gpu-prod": _ints(4), "gpu-flex": _ints(8)},
        capped={"w": [True] * (HOUR // 2) + [False] * (HOUR // 2)},
        **common,  # type: ignore[arg-type]
    )
    return _result(policy, pooled, fixed, reserve_gpus=2)


# -- the unit ---------------------------------------------------------------------------------


def test_flex_work_doubling_reads_twice_the_useful_gpu_hours(policy: PoolPolicy) -> None:
    """Production idle; flex busy on 3 GPU-equivalents fixed, 6 pooled: 2.00x."""
    common = {"total": _ints(16), "prod_busy": _flat(0.0)}
    fixed = _replay("fixed", flex_running=_ints(4), flex_duty=_flat(0.75), **common)  # type: ignore[arg-type]
    pooled = _replay("pooled", flex_running=_ints(6), flex_duty=_flat(1.0), **common)  # type: ignore[arg-type]
    result = _result(policy, pooled, fixed)
    assert (result.pooled.useful_gpu_h, result.fixed.useful_gpu_h) == (6.0, 3.0)
    assert result.useful_gpu_h_ratio == 2.0


def test_a_production_gpu_hour_weighs_what_a_flex_one_does(doubled: Result) -> None:
    """Production's 4 busy GPU-hours count as 4, not at any model's token rate: flex going
    from 4 to 12 busy GPU-hours doubles the cluster's useful GPU-hours (8 -> 16)."""
    assert doubled.fixed.useful_gpu_h == pytest.approx(8.0)
    assert doubled.pooled.useful_gpu_h == pytest.approx(16.0)
    assert doubled.useful_gpu_h_ratio == pytest.approx(2.0)
    assert doubled.fixed_duty_cycle == pytest.approx(0.5)
    assert doubled.pooled.cluster_duty_cycle == pytest.approx(1.0)
    # tokens are flex's own figure: the same tokens pooled and fixed, whatever the ratio
    assert doubled.pooled.flex_tokens_per_s == doubled.fixed.flex_tokens_per_s


def test_production_short_counts_only_what_it_was_served(policy: PoolPolicy) -> None:
    common = {"total": _ints(8), "prod_busy": _flat(4.0)}
    starved = _replay(
        "pooled",
        flex_running=_ints(0),
        flex_duty=_flat(0.0),
        served=_flat(3.0),
        **common,  # type: ignore[arg-type]
    )
    s = summarize(starved, policy)
    assert (s.useful_gpu_h, s.prod_busy_gpu_h, s.prod_short_gpu_h) == (3.0, 4.0, 1.0)


def test_the_harvest_bound_rounds_production_up_at_every_step(policy: PoolPolicy) -> None:
    """10 GPUs; production busy on 2.1, 2.0 (plus float noise), 0 and 11.5 GPU-equivalents:
    the bound is 7 + 8 + 10 + 0 GPUs, each step on its own (not the mean's ceiling, not
    negative where production wants more than the cluster)."""
    busy = [2.1, 2.0 + 1e-12, 0.0, 11.5]
    replay = _replay(
        "pooled",
        total=[10] * 4,
        prod_busy=busy,
        prod_gpus=[3, 2, 0, 10],
        flex_running=[7, 8, 10, 0],
        flex_duty=[1.0] * 4,
    )
    s = summarize(replay, policy)
    assert s.harvest_bound_gpu_h == pytest.approx(25 * STEP_S / 3600)
    assert s.harvested_gpu_h == pytest.approx(25 * STEP_S / 3600)
    assert s.harvest_efficiency == pytest.approx(1.0)


def test_the_bound_not_harvested_is_told_apart_by_where_it_went(policy: PoolPolicy) -> None:
    """16 GPUs for an hour; production busy on 2.5 GPU-equivalents (3 whole GPUs) holds 8,
    flex holds 5 of which 4 run, 3 are free and the reserves keep 2: of the bound's 13 GPUs
    flex runs on 4, and the other 9 are production's headroom 5, the reserve 2, other free
    1 and flex starting 1."""
    replay = _replay(
        "pooled",
        total=_ints(16),
        prod_busy=_flat(2.5),
        prod_gpus=_ints(8),
        flex_running=_ints(4),
        flex_gpus=_ints(5),
        flex_duty=_flat(1.0),
    )
    s = summarize(replay, policy, reserve_gpus=2)
    assert (s.harvest_bound_gpu_h, s.harvested_gpu_h) == (13.0, 4.0)
    lost = s.harvest_lost
    assert (lost.production_headroom, lost.reserve, lost.other_free, lost.flex_starting) == (
        5.0,
        2.0,
        1.0,
        1.0,
    )
    assert lost.largest() == "production headroom 5, reserve 2, other free 1, flex starting 1"
    assert summarize(replay, policy).harvest_lost.other_free == 3.0  # no reserve: all free


def test_nothing_to_harvest_has_no_efficiency(policy: PoolPolicy) -> None:
    replay = _replay(
        "pooled", total=[4] * 4, prod_busy=[4.0] * 4, flex_running=[0] * 4, flex_duty=[0.0] * 4
    )
    s = summarize(replay, policy)
    assert (s.harvest_bound_gpu_h, s.harvest_efficiency) == (0.0, None)


def test_pending_pod_minutes_by_cause_and_capped_hours(policy: PoolPolicy) -> None:
    pending = {Waiting.PREEMPTION: [2, 2, 0, 0], Waiting.CAPACITY: [0, 0, 0, 4]}
    replay = _replay(
        "pooled",
        total=[8] * 4,
        prod_busy=[1.0] * 4,
        flex_running=[4] * 4,
        flex_duty=[1.0] * 4,
        pending=pending,
        capped={"a": [True, True, False, True], "b": [False] * 4},
    )
    s = summarize(replay, policy)
    assert s.prod_pending_pod_minutes == {"preemption": 1.0, "fragmented": 0.0, "capacity": 1.0}
    assert s.prod_unmet_pod_minutes == 2.0
    assert s.flex_capped_h == {"a": pytest.approx(3 * STEP_S / 3600), "b": 0.0}


# -- the report -------------------------------------------------------------------------------


def test_the_headline_leads_with_the_useful_gpu_hours_ratio(doubled: Result) -> None:
    line = markdown.headline(doubled)
    assert line.startswith(
        "**2.00x cluster useful GPU-hours** (pooled 16.0 vs fixed 8.0; "
        "cluster duty cycle 50.0% -> 100.0%)"
    )
    order = [
        "harvested 12.0 of a 12.0 GPU-h bound (efficiency 1.00)",
        "production unharmed (0.00 busy GPU-h short vs 0.00 fixed; pending pod-minutes: "
        "0.0 preemption, 0.0 fragmented, 0.0 capacity)",
        "flex evictions max 0.00/min",
        "flex tokens/s 67 pooled vs 67 fixed",
        "flex capped by max_replicas for 0.5 h (w)",
    ]
    at = [line.index(part) for part in order]
    assert at == sorted(at), line
    assert "tokens/s" not in line.split(";")[0]


def test_the_headline_says_when_production_was_harmed(doubled: Result) -> None:
    short = replace(doubled.pooled, prod_short_gpu_h=0.5)  # allowed: 0.1 % of 4 GPU-h
    assert "production HARMED (0.50 busy GPU-h short" in markdown.headline(
        replace(doubled, pooled=short)
    )
    assert "flex capped" not in markdown.headline(
        replace(doubled, pooled=replace(doubled.pooled, flex_capped_h={"w": 0.0}))
    )


def test_the_report_opens_with_the_headline_and_scores_every_goal(doubled: Result) -> None:
    text = markdown.report(doubled)
    title, blank, head, *_ = text.splitlines()
    assert title.startswith("## What-if") and blank == ""
    assert head == markdown.headline(doubled)
    assert "- met: useful GPU-hours, pooled / fixed 2.00x" not in text  # fixed duty 50 %: n/a
    assert "- n/a: useful GPU-hours, pooled / fixed 2.00x (fixed duty cycle 50.0%)" in text
    assert "- met: harvest efficiency 1.000" in text
    missed = replace(doubled, pooled=replace(doubled.pooled, evictions_per_minute_max=6.0))
    assert "- MISSED: flex evictions per minute (max) 6.00 (goal <= 5)" in markdown.report(missed)


def test_the_json_carries_the_keys_scripts_read(doubled: Result, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(output.json_bytes(doubled))
    data = json.loads(path.read_text())
    assert data["useful_gpu_h_ratio"] == pytest.approx(2.0)
    assert data["fixed_duty_cycle"] == pytest.approx(0.5)
    for replay in ("pooled", "fixed"):
        for key in (
            "useful_gpu_h",
            "cluster_duty_cycle",
            "harvested_gpu_h",
            "harvest_bound_gpu_h",
            "harvest_efficiency",
            "prod_short_gpu_h",
            "prod_busy_gpu_h",
            "prod_pending_pod_minutes",
            "evictions_per_minute_max",
            "flex_tokens_per_s",
            "flex_capped_h",
        ):
            assert key in data[replay], (replay, key)
    assert data["pooled"]["useful_gpu_h"] == pytest.approx(16.0)
    assert data["fixed"]["useful_gpu_h"] == pytest.approx(8.0)
    assert data["pooled"]["harvest_efficiency"] == pytest.approx(1.0)
    assert data["pooled"]["flex_capped_h"] == {"w": pytest.approx(0.5)}
    assert set(data["pooled"]["prod_pending_pod_minutes"]) == {c.value for c in Waiting}
    assert [g["name"] for g in data["goals"]] == [g.name for g in doubled.goals]
    gone = {"throughput_ratio", "useful_tokens_per_s", "prod_tokens_per_s", "harvestable_gpu_h"}
    assert not gone & {*data, *data["pooled"], *data["fixed"]}
    assert data["series"]["pooled"]["useful_gpus"][0] == pytest.approx(16.0)


def test_console_tables_keep_every_value_whole_at_80_columns(
    doubled: Result, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster-sized replay's figures (a year of 10,000 GPUs) and a long workload name."""
    big: dict[str, Any] = {
        "useful_gpu_h": 87_654_321.5,
        "harvested_gpu_h": 12_345_678.9,
        "harvest_bound_gpu_h": 23_456_789.1,
        "prod_busy_gpu_h": 65_432_109.8,
        "flex_tokens_per_s": 123_456_789.0,
        "kv_tokens_lost": 98_765_432_109.0,
        "prod_pending_pod_minutes": {"preemption": 1_234_567.8, "fragmented": 2_345_678.9},
    }
    pooled = replace(
        doubled.pooled, **big, flex_capped_h={"llama-3.1-70b-instruct-batch-flex": 8_765.4}
    )
    result = replace(doubled, pooled=pooled, fixed=replace(doubled.fixed, **big))
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, highlight=False, color_system=None)
    monkeypatch.setattr(whatif_commands, "console", console)
    whatif_commands.print_summary(result, "a constructed replay")
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for _, pooled_cell, fixed_cell in markdown.rows(result.pooled, result.fixed):
        for token in (pooled_cell + " " + fixed_cell).split():
            assert token in text, token


def _class(arrived: int, served: int, queued: int, shed: int) -> ClassFigures:
    return ClassFigures(
        priority=-10,
        served_by="flex",
        sheddable=True,
        arrived=arrived,
        served=served,
        queued=queued,
        shed=shed,
        dropped=arrived - served - queued - shed,
        lost=12_345,
        drained=67_890,
        served_share=served / arrived,
        queued_share=queued / arrived,
        shed_share=shed / arrived,
        shed_during_bursts=1_234_567,
        burst_minutes=531.0,
        shed_at_start=7_654_321,
        start_minutes=5.0,
    )


def test_the_class_table_keeps_every_value_whole_at_80_columns(
    doubled: Result, monkeypatch: pytest.MonkeyPatch
) -> None:
    classes = {
        "production": _class(32_052_700, 15_035_400, 1_234_567, 0),
        "batch": _class(21_103_400, 21_025_300, 24_571, 78_100),
    }
    result = replace(
        doubled,
        pooled=replace(doubled.pooled, traffic_classes=classes),
        fixed=replace(doubled.fixed, traffic_classes=classes),
    )
    out = io.StringIO()
    monkeypatch.setattr(
        whatif_commands,
        "console",
        Console(file=out, width=80, force_terminal=True, highlight=False, color_system=None),
    )
    whatif_commands.print_classes(result)
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for row in class_text.class_rows(result.pooled, result.fixed):
        for token in " ".join(row).split():
            assert token in text, token


# -- plots ------------------------------------------------------------------------------------


def test_plots_are_written_and_linked_from_the_reports_folder(
    doubled: Result, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = tmp_path / "out" / "report.md"
    names = whatif_commands.write_outputs(
        doubled, OutputPaths(plots=tmp_path / "out" / "img", markdown_out=report)
    )
    assert [Path(n).name for n in names] == list(output.PLOTS)
    assert output.PLOTS[:2] == ("gpus_held.png", "duty_cycle.png")
    for name in names:
        assert Path(name).read_bytes().startswith(b"\x89PNG")
    text = report.read_text()
    links = [line for line in text.splitlines() if line.startswith("![")]
    assert links[:2] == ["![gpus_held](img/gpus_held.png)", "![duty_cycle](img/duty_cycle.png)"]
    assert text.index(links[0]) < text.index("| | pooled | fixed |")


def test_the_held_bands_stack_to_every_gpu(doubled: Result) -> None:
    """Production, flex per pool, starting flex, the reserve and idle sum to the cluster;
    the reserve is never more than the unallocated GPUs."""
    bands, labels, _ = output._held_bands(doubled)
    total = doubled.replays[0].series.array("total_gpus")
    assert np.allclose(np.sum(bands, axis=0), total)
    assert labels == [
        "production",
        "flex on gpu-prod",
        "flex on gpu-flex",
        "flex starting or stopping",
        "reserve (kept free)",
        "idle",
    ]
    reserve = bands[labels.index("reserve (kept free)")]
    assert reserve.max() == 0  # 16 - 4 - 12: nothing free to keep


# -- the demo's defaults ----------------------------------------------------------------------


def test_the_demo_replays_the_policys_pools_with_a_backlog(policy: PoolPolicy) -> None:
    whatif = build_whatif(DEMO, policy)
    assert whatif.layout == "policy"
    ((name, demand),) = whatif.demand.items()
    assert name == policy.workloads[0].name
    assert demand.backlog is not None and not demand.traces


@pytest.mark.parametrize(("layout", "says"), [("policy", False), ("trace", True)])
def test_a_trace_layout_says_it_resizes_the_hardware(
    policy: PoolPolicy, layout: str, says: bool
) -> None:
    options = replace(DEMO, hours=0.05, layout=layout)  # type: ignore[arg-type]
    result = run(policy, DEFAULT_POLICY.parent, build_whatif(options, policy))
    lines = [a for a in result.assumptions if "resizes the hardware" in a]
    assert bool(lines) is says, result.assumptions
