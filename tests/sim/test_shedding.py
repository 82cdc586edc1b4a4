"""The what-if replays sheddable traffic under a production burst and reports requests shed,
queued and served (issue 14, the what-if test), with the endpoint picker's semantics.

The constructed cluster: gpu-prod and gpu-flex one 8-GPU node each, eight one-GPU flex
replicas filling gpu-flex, production on the duty rule (one-GPU pods, ceil(busy / 0.6)). Its
trace needs one pod, then 16 (every GPU of both pools) for minutes 30-40: the burst preempts
all eight flex replicas at 1800 s. Traffic class ``batch`` (-10, flex: sheddable) and
``production`` (100, production instances) each get a request every 10 s from 300 s.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from policy import PoolPolicy, load_policy, parse_policy
from runtime.cli.app import app
from runtime.sim.class_text import CLASS_COLUMNS, class_lines, class_rows
from runtime.sim.classes import (
    ClassPlan,
    Detector,
    Member,
    ProductionDemand,
    pool_saturation,
)
from runtime.sim.engine import replay_fixed, replay_pooled
from runtime.sim.options import _split
from runtime.sim.replay_model import FlexInput, Layout, Replay, Settings
from runtime.sim.report import summarize
from runtime.sim.request_stream import Admission, Requests, StepLatencies
from runtime.sim.serving import Fleet
from runtime.sim.traces import ProductionTrace
from tests.sim.test_engine import DUTY, Latencies, _run, _stream, _without_production

DATA = Path(__file__).parent / "data"
runner = CliRunner()

PRODUCTION, BATCH = 0, 1
"""Indices of the default traffic classes (``production``, ``batch``) in the policy's order."""
BURST_AT = 1800.0
FLEX_BACK_AT = 2505.0
"""The first step with a flex replica running again: production scales down at 2400, the
flex HPA scales up (its budget is evaluated every 30 s) and the new replicas start in 60 s."""
PRODUCTION_DOWN_AT = 2445.0
"""The first step production holds its median (1 GPU) again: its 15 extra pods, deleted at
2400, exit after their 40 s graceful shutdown."""
PRODUCTION_READY_AT = 2145.0
"""The burst's new production pods bind at 1845 (once the flex victims exit) and start in
300 s: until then production's one running pod is at 100 % and lends no GPU time."""


def _policy(**picker: Any) -> PoolPolicy:
    """The constructed cluster; the served model's production instances are the production
    workload's pods (in ``inference``); ``picker`` overrides endpoint-picker fields."""
    document = load_policy().model_dump(mode="json")
    document["node_pools"][0]["max_nodes"] = 1
    document["node_pools"][1]["max_nodes"] = 1
    document["production"] = [
        {
            "namespace": "inference",
            "name": "llama-8b-prod",
            "gpus_per_replica": 1,
            "min_replicas": 1,
            "max_replicas": 16,
        }
    ]
    document["workloads"][0].update(min_replicas=8, max_replicas=8, kv_compaction=False)
    serving = document["serving"]
    serving["models"] = [
        {
            "name": "llama-8b",
            "model": document["workloads"][0]["model"],
            "production": {"namespace": "inference", "pod_labels": {"app": "x"}, "port": 8000},
        }
    ]
    serving["traffic_classes"] = [
        {"name": "production", "priority": 100, "served_by": "production"},
        {"name": "batch", "priority": -10, "served_by": "flex"},
    ]
    serving["endpoint_picker"].update(picker)
    return parse_policy(document)


def _arrivals(
    cls: int, *, start: float = 300.0, stop: float = 5400.0, output: int = 100
) -> Requests:
    """A request every 10 s in [start, stop), 1000 prompt tokens, all in class ``cls``."""
    t = np.arange(start, stop, 10.0)
    n = t.size
    return Requests(
        t,
        np.full(n, 1000, dtype=np.int64),
        np.full(n, output, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        traffic_class=np.full(n, cls, dtype=np.int64),
    )


def _burst(minutes: int = 90) -> ProductionTrace:
    """Production needs one pod, then 16 for minutes 30-40 (busy 9.5 at target 0.6)."""
    busy = np.full(minutes, 0.5)
    busy[30:40] = 9.5
    return ProductionTrace("burst", 0.0, 60.0, np.full(minutes, 10, dtype=np.int64), busy)


def _plan(policy: PoolPolicy, production: Requests) -> ClassPlan:
    demand = ProductionDemand(
        pool="llama-8b-production",
        namespace="inference",
        requests=production,
        latencies=Latencies(),
        kv_tokens=10**6,
        max_num_seqs=256,
        max_model_len=8192,
        replica_gpus=1,
    )
    return ClassPlan.of_policy(policy, {policy.workloads[0].name: "llama-8b-flex"}, (demand,))


def _replay(
    hours: float = 1.5, batch: Requests | None = None, latencies: StepLatencies | None = None
) -> tuple[Replay, Replay, PoolPolicy]:
    policy = _policy()
    plan = _plan(policy, _arrivals(PRODUCTION))
    served = latencies or Latencies()
    flex = [FlexInput(policy.workloads[0], batch or _arrivals(BATCH), 10**6, served)]
    settings = Settings(hours=hours, flex_startup_s=60, production=DUTY)
    layout = Layout.of_policy(policy)
    args = (policy, layout, _burst(), flex, settings)
    pooled = replay_pooled(*args, classes=plan)
    fixed = replay_fixed(*args, classes=plan)
    return pooled, fixed, policy


def _in(requests: Requests, after: float, until: float) -> int:
    """Requests arriving in (after, until]: what the steps from ``after`` admit."""
    t = requests.arrival_s
    return int(((t > after) & (t <= until)).sum())


def test_a_burst_that_evicts_every_flex_pod_sheds_batch_and_queues_production() -> None:
    """Batch arriving while no flex replica is ready is shed, one request every 10 s: the
    steps 1800-2490 answer the arrivals 1810-2500 (a step admits what arrives up to its
    end), 70 requests; 64 of them (1810-2440) while production held more than its median.
    Production's class is never shed and every request of it is served."""
    pooled, fixed, policy = _replay()
    s = pooled.series
    empty = [t for t, n in zip(s.t, s.flex_running_gpus, strict=True) if n == 0 and t >= 300]
    assert (empty[0], empty[-1], len(empty)) == (BURST_AT, FLEX_BACK_AT - 15, 47)
    assert sum(s.evictions) == 8 and s.evictions[s.t.index(BURST_AT)] == 8
    batch = pooled.classes["batch"]
    assert batch.shed == 70 == _in(_arrivals(BATCH), BURST_AT, FLEX_BACK_AT)
    summary = summarize(pooled, policy)
    figures = summary.traffic_classes
    assert figures is not None
    assert (
        figures["batch"].shed_during_bursts
        == 64
        == _in(_arrivals(BATCH), BURST_AT, PRODUCTION_DOWN_AT)
    )
    assert figures["batch"].burst_minutes == (PRODUCTION_DOWN_AT - BURST_AT) / 60
    assert (figures["batch"].shed_at_start, figures["batch"].start_minutes) == (0, 1.0)
    assert (batch.arrived, batch.served, batch.queued, batch.lost) == (510, 440, 0, 0)
    assert figures["batch"].shed_share == pytest.approx(70 / 510)
    prod = pooled.classes["production"]
    assert (prod.arrived, prod.served, prod.queued, prod.shed) == (510, 510, 0, 0)
    # The fixed topology evicts nothing: its six flex replicas take every batch request.
    assert (fixed.classes["batch"].shed, fixed.classes["batch"].served) == (0, 510)
    assert summarize(fixed, policy).traffic_classes["batch"].burst_minutes == 0  # type: ignore[index]


def test_what_the_cold_start_sheds_is_not_a_burst() -> None:
    """The pooled replay starts flex cold: its replicas are ready at 60 s, so batch arriving
    from 0 s is shed until then (0-60 s: seven requests, the step at 45 s admits up to
    60 s), counted as shed at the start; the fixed topology starts warm and sheds nothing."""
    pooled, fixed, policy = _replay(batch=_arrivals(BATCH, start=0.0))
    p = summarize(pooled, policy).traffic_classes
    f = summarize(fixed, policy).traffic_classes
    assert p is not None and f is not None
    assert (p["batch"].shed_at_start, p["batch"].start_minutes) == (7, 1.0)
    assert p["batch"].shed == 7 + 70 and p["batch"].shed_during_bursts == 64
    assert (f["batch"].shed, f["batch"].shed_at_start, f["batch"].start_minutes) == (0, 0, 0.0)


def test_production_traffic_queues_through_the_burst_and_is_served_after() -> None:
    """Ending the replay at 2100 s, inside the burst: production's one running pod is busy,
    so every production-class request since 1800 waits (none shed); the full replay serves
    them all once the new pods run (previous test)."""
    pooled, _, _ = _replay(hours=2100 / 3600)
    prod = pooled.classes["production"]
    waiting = _in(_arrivals(PRODUCTION), BURST_AT, 2100.0)
    assert (prod.queued, prod.shed) == (waiting, 0) and waiting == 30
    assert prod.served == _in(_arrivals(PRODUCTION), 0.0, BURST_AT) == 151
    assert PRODUCTION_READY_AT > 2100
    assert pooled.classes["batch"].shed == _in(_arrivals(BATCH), BURST_AT, 2100.0)


def test_every_request_is_served_queued_shed_dropped_or_lost() -> None:
    """Long requests (200 s alone at 50 ms a token; some over max_model_len) that keep the
    flex fleet busy when the burst preempts it: per class arrived = served + queued + shed +
    dropped + lost, the served requests are the fleets' own completions, and the in-flight
    requests of the preempted replicas were partly drained, partly lost."""
    batch = _arrivals(BATCH, stop=3600.0, output=4000)
    prompts = batch.input_tokens.copy()
    prompts[::25] = 9000  # over max_model_len 8192
    batch = replace(batch, input_tokens=prompts)
    pooled, fixed, _ = _replay(hours=1.0, batch=batch, latencies=_SlowDecode())
    for replay in (pooled, fixed):
        for c in replay.classes.values():
            assert c.arrived == c.served + c.queued + c.shed + c.dropped + c.lost
        (flex,) = replay.fleets.values()
        assert replay.classes["batch"].served == flex.completed
        assert replay.classes["batch"].arrived == _in(batch, 0.0, 3600.0)
        assert (
            replay.classes["batch"].dropped
            == flex.dropped
            == _in(replace(batch, arrival_s=batch.arrival_s[prompts > 8192]), 0.0, 3600.0)
        )
        assert flex.outstanding == replay.classes["batch"].queued
        (prod,) = replay.production_fleets.values()
        assert replay.classes["production"].served == prod.completed
    lost = pooled.classes["batch"]
    assert lost.lost > 0 and lost.drained > 0
    assert fixed.classes["batch"].lost == 0


def _fleet(
    requests: Requests,
    sheddable_by_class: list[bool],
    *,
    window_s: float = 30.0,
    backlog_window: int = 0,
) -> Fleet:
    return Fleet.admit(
        requests,
        max_model_len=10**6,
        latencies=_SlowDecode(),
        kv_tokens=10**9,
        max_num_seqs=64,
        preservation=False,
        admission=Admission(np.array(sheddable_by_class), window_s),
        backlog_window=backlog_window,
    )


class _SlowDecode:
    """No prefill time, 50 ms per decode step whatever the batch."""

    def prefill_s(self, tokens: object) -> np.ndarray:
        return np.zeros_like(np.asarray(tokens, dtype=np.float64))

    def decode_step_s(self, batch: object, context: object) -> np.ndarray:
        return np.asarray(0.05)


def _requests(outputs: list[int], classes: list[int], arrival_s: float = 0.0) -> Requests:
    n = len(outputs)
    return Requests(
        np.full(n, arrival_s),
        np.full(n, 100, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        traffic_class=np.asarray(classes, dtype=np.int64),
    )


def test_requests_in_flight_on_an_exiting_pod_drain_within_the_window_or_are_lost() -> None:
    """Eight requests in the batch of one replica when it exits: 100 tokens at 50 ms take
    5 s alone, inside the 30 s window (preStop 5 + drain 25): all four drain; 1000 tokens
    take 50 s, so each finishes with probability 30/50: 2.4 of four, rounded to 2."""
    fleet = _fleet(_requests([100] * 4 + [1000] * 4, [0] * 8), [True])
    result = fleet.serve(0.0, 0.1, 1)
    assert result.completed == 0 and fleet.waiting == 0
    fleet.lose_replicas(1, 1, 0.1)
    after = fleet.serve(0.1, 15.0, 0)
    assert after.completed == 6
    assert after.output_tokens == round(4 * 100 + 4 * 1000 * 30 / 50)
    counts = fleet.class_counts(15.1)
    assert (counts.served[0], counts.drained[0], counts.lost[0], counts.queued[0]) == (6, 6, 2, 0)
    # A window as long as the longest request drains all of them.
    longer = _fleet(_requests([100] * 4 + [1000] * 4, [0] * 8), [True], window_s=50.0)
    longer.serve(0.0, 0.1, 1)
    longer.lose_replicas(1, 1, 0.1)
    assert longer.serve(0.1, 15.0, 0).completed == 8


def test_a_saturated_pool_sheds_sheddable_arrivals_and_queues_the_rest() -> None:
    """A replica-less fleet: its queue is what the picker reads as waiting; at the policy's
    queue depth (5) the pool is saturated and a sheddable arrival is shed, a non-sheddable
    one queued."""
    detector = Detector.of_policy(_policy())
    classes = [0, 1] * 4 + [0, 1] * 2
    times = [0.0] * 8 + [20.0] * 4
    requests = replace(_requests([10] * 12, classes), arrival_s=np.asarray(times))
    fleet = _fleet(requests, [False, True])
    sat = pool_saturation([Member("p", 1, fleet.waiting, fleet.kv_usage)], detector)["p"]
    fleet.serve(0.0, 15.0, 0, saturated=sat >= 1)
    assert (sat, fleet.waiting, fleet.step_shed.tolist()) == (0.0, 8.0, [0, 0])
    sat = pool_saturation([Member("p", 1, fleet.waiting, fleet.kv_usage)], detector)["p"]
    fleet.serve(15.0, 15.0, 0, saturated=sat >= 1)
    assert sat == 8 / 5 and fleet.step_shed.tolist() == [0, 2] and fleet.waiting == 10
    counts = fleet.class_counts(30.0)
    assert counts.queued.tolist() == [6, 4] and counts.shed.tolist() == [0, 2]


def test_the_detector_reads_the_pickers_thresholds() -> None:
    """Queue depth and KV usage as rendered in the EndpointPickerConfig; each ready
    instance scores its worst ratio, a pool the mean, and none ready fails closed."""
    assert Detector.of_policy(_policy()) == Detector(5, 0.8)
    # What a request in flight on an exiting pod has: preStop 5 s, then vLLM's drain 25 s.
    assert ClassPlan.of_policy(_policy(), {}).drain_window_s == 5 + 25
    detector = Detector.of_policy(_policy(queue_depth_max=7))
    assert detector == Detector(7, 0.8)
    members = [
        Member("a", 2, 14.0, 0.4),  # 7 waiting each: 1.0, saturated
        Member("b", 4, 8.0, 0.72),  # KV 0.72 / 0.8 = 0.9 beats 2 / 7
        Member("b", 4, 0.0, 0.0),
        Member("c", 0, 0.0, 0.0),  # nothing ready
    ]
    got = pool_saturation(members, detector)
    assert got == {"a": 1.0, "b": pytest.approx(0.45), "c": 1.0}
    classes = _policy().serving.traffic_classes  # type: ignore[union-attr]
    assert [c.sheddable for c in classes] == [False, True]


def test_a_sheddable_backlog_is_never_shed() -> None:
    """A backlog's client resubmits what is refused: saturated or not, it keeps its window
    outstanding and nothing of it counts as shed."""
    backlog = replace(_requests([10] * 4, [0] * 4), backlog=True)
    fleet = _fleet(backlog, [True], backlog_window=16)
    fleet.serve(0.0, 15.0, 0, saturated=True)
    assert fleet.arrived(15.0) == 16 and fleet.waiting == 16
    fleet.serve(15.0, 15.0, 2, saturated=True)
    counts = fleet.class_counts(30.0)
    assert counts.shed[0] == 0 and counts.served[0] > 0
    assert counts.arrived[0] == counts.served[0] + counts.queued[0] == fleet.done + 16


# -- without a serving section nothing changes ------------------------------------------------


def _digest(value: object) -> str:
    """A hash of ``value`` with floats at 9 significant digits (the recorded replays')."""

    def rounded(v: object) -> object:
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in sorted(v.items())}
        if isinstance(v, list | tuple):
            return [rounded(x) for x in v]
        if isinstance(v, float):
            return float(f"{v:.9g}")
        return v

    return hashlib.sha256(json.dumps(rounded(value), sort_keys=True).encode()).hexdigest()


SERIES_ADDED_SINCE = ("prod_pending_by_cause", "flex_by_pool", "capped")
"""Series fields added after the recording; the digest covers the fields recorded then."""


SUMMARY_ADDED_SINCE = ("harvest_lost", "harvest_value")
"""Summary fields added after the summaries were re-recorded (tests/sim/test_headline.py)."""


def _recorded_series(replay: Replay) -> dict[str, Any]:
    series = asdict(replay.series)
    return {k: v for k, v in series.items() if k not in SERIES_ADDED_SINCE}


def _engine_outputs() -> dict[str, Any]:
    """Both replays of the frozen policy without production workloads or serving section:
    a burst preempts flex at minute 30; a request stream and a backlog."""
    policy = parse_policy(_without_production(load_policy(DATA / "no_serving.yaml")))
    held = np.full(120, 10, dtype=np.int64)
    held[30:60] = 94
    trace = ProductionTrace("burst", 0.0, 60.0, held, held * 0.6)
    out: dict[str, Any] = {}
    streams = (
        ("stream", _stream(40_000, backlog=False, spacing_s=0.2)),
        ("backlog", _stream(64, backlog=True)),
    )
    for label, requests in streams:
        replays = _run(policy, trace, requests)
        out[label] = {
            r.name: {
                "summary": {
                    k: v
                    for k, v in asdict(summarize(r, policy)).items()
                    if k not in SUMMARY_ADDED_SINCE
                },
                "series": _digest(_recorded_series(r)),
                "fleets": {k: asdict(v) for k, v in r.fleets.items()},
            }
            for r in replays
        }
    return out


def _approx(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v) for v in value]
    if isinstance(value, float) and math.isfinite(value):
        return pytest.approx(value, rel=1e-9, abs=1e-12)
    return value


def test_without_a_serving_section_the_replay_is_what_it_was() -> None:
    """Recorded before traffic classes existed (``data/engine_without_serving.json``): the same
    summaries, series and fleet totals; the new per-fleet counters stay 0 and the summary has
    no traffic classes. The summaries were re-recorded when the figures moved to GPU-hours
    (useful GPU-hours, the harvest bound), and with the series digests when production found
    running began serving from the first step (the pooled replays' ``prod_busy_served[0]``,
    the only series value that changed; the rest of every series and the fleet totals are
    the original recording's)."""
    recorded = json.loads((DATA / "engine_without_serving.json").read_text())
    now = _engine_outputs()
    for label, replays in now.items():
        for name, got in replays.items():
            assert got["summary"].pop("traffic_classes") is None
            for fleet in got["fleets"].values():
                assert (fleet.pop("shed"), fleet.pop("lost")) == (0, 0)
            assert got == _approx(recorded[label][name]), (label, name)


def _policy_dir(tmp_path: Path, source: Path) -> Path:
    """``source`` in a folder of its own with the shipped model configs beside it."""
    folder = tmp_path / "policy"
    shutil.copytree(DATA.parent.parent.parent / "policy" / "models", folder / "models")
    text = source.read_text().replace("../../../policy/models/", "models/")
    (folder / "pool.yaml").write_text(text)
    return folder / "pool.yaml"


def test_without_a_serving_section_the_whatif_json_is_what_it_was(tmp_path: Path) -> None:
    """``gpupool whatif`` on the frozen policy without a serving section writes the JSON
    recorded without traffic classes (``data/whatif_without_serving.json``): no
    ``traffic_classes`` key, nothing else changed; the markdown has no class table.
    Re-recorded when the figures moved to GPU-hours and the fixed topology gave flex every
    GPU production never holds, and when production found running began serving from the
    first step."""
    out = tmp_path / "r.json"
    policy = _policy_dir(tmp_path, DATA / "no_serving.yaml")
    args = ["whatif", "--policy", str(policy), "--hours", "1", "--json", str(out)]
    result = runner.invoke(app, [*args, "--markdown", str(tmp_path / "r.md")])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert "traffic_classes" not in data["pooled"] and "traffic_classes" not in data["fixed"]
    recorded = json.loads((DATA / "whatif_without_serving.json").read_text())
    for name in ("pooled", "fixed"):  # added since (tests/sim/test_headline.py)
        assert data[name].pop("harvest_value") is None  # the policy prices no pool
        assert set(data[name].pop("harvest_lost")) == {
            "production_headroom",
            "reserve",
            "other_free",
            "flex_starting",
        }
    for goal in data["goals"]:  # added since: why a goal was MISSED
        assert (goal.pop("cause") is None) == (goal["met"] is not False)
    (harvest,) = (g for g in data["goals"] if g["name"] == "harvest efficiency")
    harvest["value"], _, causes = harvest["value"].partition(" (GPU-h of the bound not harvested")
    assert causes, "the harvest goal names where the bound went"
    assert data == _approx(recorded)
    assert "Traffic classes" not in (tmp_path / "r.md").read_text()
    assert "Traffic classes" not in result.output


# -- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("mooncake", ("w", "mooncake", None)),
        ("mooncake:batch", ("w", "mooncake", "batch")),
        ("other=traces/a.csv:production", ("other", "traces/a.csv", "production")),
        ("dir:x/trace.csv", ("w", "dir:x/trace.csv", None)),
        ("trace.csv:", ("w", "trace.csv:", None)),
    ],
)
def test_a_trace_names_its_class_after_a_colon(spec: str, expected: tuple[str, ...]) -> None:
    assert _split(spec, "w") == expected


def test_whatif_reports_each_class_in_json_markdown_and_console(tmp_path: Path) -> None:
    policy = _policy_dir(tmp_path, DATA / "serving_burst.yaml")
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "whatif",
            "--policy",
            str(policy),
            "--hours",
            "0.5",
            "--flex-trace",
            "azure-code:batch",
            "--flex-trace",
            "mooncake:production",
            "--json",
            str(out / "r.json"),
            "--markdown",
            str(out / "r.md"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "r.json").read_text())
    for replay in ("pooled", "fixed"):
        classes = data[replay]["traffic_classes"]
        assert set(classes) == {"production", "batch"}
        for c in classes.values():
            parts = ("served", "queued", "shed", "dropped", "lost")
            assert c["arrived"] == sum(c[k] for k in parts)
            assert c["arrived"] > 0
        assert classes["production"]["shed"] == 0
    assert any("traffic classes production (100, production)" in a for a in data["assumptions"])
    text = (out / "r.md").read_text()
    assert "| class | replay | arrived | served | queued | shed |" in text
    assert "| batch | pooled |" in text and "| production | fixed |" in text
    assert "Traffic classes (production: priority 100" in result.output


@pytest.mark.parametrize(
    ("policy", "spec", "message"),
    [
        ("serving_burst.yaml", "azure-code:nosuch", "traffic class 'nosuch' is not in"),
        ("no_serving.yaml", "azure-code:batch", "the policy has no serving section"),
        ("default", "azure-code:production", "served model 'llama-8b' has none"),
    ],
)
def test_a_class_the_policy_cannot_route_is_one_line(
    tmp_path: Path, policy: str, spec: str, message: str
) -> None:
    source = DATA.parent.parent.parent / "policy" / "pool.yaml"
    file = _policy_dir(tmp_path, source if policy == "default" else DATA / policy)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["whatif", "--policy", str(file), "--hours", "0.1", "--flex-trace", spec, "--json",
         str(out / "r.json")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_backlog_for_production_is_refused(tmp_path: Path) -> None:
    file = _policy_dir(tmp_path, DATA / "serving_burst.yaml")
    args = ["whatif", "--policy", str(file), "--hours", "0.1"]
    result = runner.invoke(
        app,
        [*args, "--backlog", "azure-code:production"],
    )
    assert result.exit_code == 1
    assert "a backlog is batch work for flex" in result.output


def test_the_class_table_names_every_class_that_saw_requests() -> None:
    """One row per class and replay, in the columns' order: the cold-start case (batch from
    0 s) above, with the production class queued through the end of a short replay."""
    pooled, fixed, policy = _replay(batch=_arrivals(BATCH, start=0.0))
    p, f = summarize(pooled, policy), summarize(fixed, policy)
    rows = class_rows(p, f)
    assert [r[:2] for r in rows] == [
        ("production", "pooled"),
        ("production", "fixed"),
        ("batch", "pooled"),
        ("batch", "fixed"),
    ]
    assert dict(zip(CLASS_COLUMNS, rows[2], strict=True)) == {
        "class": "batch",
        "replay": "pooled",
        "arrived": "540",
        "served": "463 (85.7%)",
        "queued": "0 (0.0%)",
        "shed": "77 (14.3%)",
        "shed in bursts": "64",
        "shed at start": "7",
        "lost (drained)": "0 (0)",
        "dropped": "0",
    }
    short = _replay(hours=2100 / 3600)
    (prod, *_) = class_rows(summarize(short[0], policy), summarize(short[1], policy))
    assert prod[2:5] == ("181", "151 (83.4%)", "30 (16.6%)")
    head = class_lines(p, f)[0]
    assert "production: priority 100, served by production; batch: priority -10" in head
