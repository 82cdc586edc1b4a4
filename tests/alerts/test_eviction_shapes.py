"""Flex eviction counting on every kube-state-metrics (KSM) shape, evaluation not aligned.

Each test writes a promtool unit-test file and runs ``promtool test rules`` on it with the
eviction recording rule and alert group generated from ``alerts/tests/policy.yaml`` (taken
from the ``bundle`` fixture, nothing else: promtool's time grows with every rule).

Scrapes are modelled exactly: input series have an interval that divides every scrape
instant (1 s for a 23 s offset) and a sample only at scrape instants (``_`` elsewhere,
``stale`` when the pod object is deleted). promtool evaluates the
rule groups at 0, E, 2E ..., so a scrape offset makes evaluation unaligned: scrapes every
30 s at 23 s past the evaluation grid are the cluster that scrapes at 0, 30 s ... and
evaluates at 7 s, 37 s ...; 10 s past a 1 m grid is a 1 m evaluation at 20 s past the minute.

The cluster: from T0 one kind of disruption hits flex pods at 6 or 12 a minute until T1, then
nothing. Each kind writes the rows the KSM release would (a dense 0/1 row per known reason up
to v2.19, sparse 1 rows from v2.20, ``kube_pod_status_disruption_reason`` from v2.20), pods
live as long as their kind keeps them (kubelet-evicted pods linger as Failed to the end).
Checked: at every evaluation after the window filled, the recorded total (and each
reason's row) is within 5 % of the true rate of what that release can see (0, present, for
what it cannot); the alert is quiet before ``for``, fires after it, keeps firing
``keep_firing_for`` after the rate dropped below the limit, then resolves.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from policy import PolicyError, PoolPolicy, parse_policy
from policy.base import duration_seconds
from runtime.metrics.catalogue import FLEX_EVICTIONS
from runtime.metrics.evictions import canonical_reasons
from tests.harness.servers import require_binary

pytestmark = pytest.mark.process

NS = "gpupool-flex"
REC = FLEX_EVICTIONS
TOTAL = f"sum by (namespace) ({REC})"
FIRING = 'ALERTS{alertname="FlexEvictionRateHigh", alertstate="firing"}'
TOLERANCE = 0.05
EXACT = 1e-9
"""Float rounding of a sum of per-reason rates."""
T0 = 60
"""Disruptions start here (dense rows exist from pod creation, before it)."""
T1 = T0 + 15 * 60
"""... and stop here, in the alert tests."""
STEADY_S = 120
"""The rate tests check every evaluation this long after the window filled."""
POD_AGE_S = 60
"""Each pod exists this long before it is disrupted."""
STATUS_REASONS_2_18 = (
    "Evicted",
    "NodeAffinity",
    "NodeLost",
    "Shutdown",
    "UnexpectedAdmissionError",
)
DENSE_ROWS = ("Evicted", "PreemptionByScheduler", "TerminationByKubelet", "NodeAffinity")
"""The dense rows written: those the policy counts and one it does not (the other uncounted
reasons' 0 rows are never read and would only slow promtool down)."""


@dataclass(frozen=True)
class Timing:
    scrape_s: int
    offset_s: int
    """Scrapes at offset + k * scrape_s; promtool evaluates at multiples of eval_s."""
    eval_s: int

    @property
    def interval_s(self) -> int:
        """The input series' interval: every scrape instant is a multiple of it."""
        return math.gcd(self.scrape_s, self.offset_s)

    @property
    def name(self) -> str:
        after = (-self.offset_s) % self.scrape_s
        return f"scrape{self.scrape_s}s-eval{self.eval_s}s-{after}s-after-scrape"


TIMINGS = (
    Timing(30, 23, 30),  # scrapes at 0, 30 s ..., rules at 7 s, 37 s ...
    Timing(30, 10, 60),  # scrapes at 0, 30 s ..., rules every minute at 20 s
    Timing(15, 10, 30),  # scrapes at 0, 15 s ..., rules at 5 s, 35 s ...
    Timing(30, 0, 30),  # aligned: a sample at exactly T - window, in both windows
)


@dataclass(frozen=True)
class Ksm:
    """What one kube-state-metrics release exports for a pod."""

    name: str
    dense: bool
    status_reasons: tuple[str, ...]
    """Reasons ``kube_pod_status_reason`` knows (a dense release has a row for each)."""
    disruption: bool
    """Exports ``kube_pod_status_disruption_reason`` (v2.20, alpha)."""
    uid: bool
    """Pod series carry ``uid`` (the query must work with and without it)."""


KSM_2_18 = Ksm("ksm<=2.18-dense", True, STATUS_REASONS_2_18, False, False)
KSM_2_19 = Ksm(
    "ksm2.19-dense",
    True,
    (*STATUS_REASONS_2_18, "PreemptionByScheduler", "TerminationByKubelet"),
    False,
    True,
)
KSM_2_20 = Ksm("ksm>=2.20-sparse", False, KSM_2_19.status_reasons, False, True)
KSM_2_20_DISRUPTION = Ksm("ksm>=2.20-sparse+disruption", False, KSM_2_19.status_reasons, True, True)
SHAPES = (KSM_2_18, KSM_2_19, KSM_2_20, KSM_2_20_DISRUPTION)


@dataclass(frozen=True)
class Kind:
    """One way a flex pod is disrupted, as the API server records it."""

    name: str
    reason: str
    """The canonical reason label it must be recorded under."""
    status: str | None
    """``status.reason`` (``kube_pod_status_reason``), where the KSM release knows it."""
    disruption: str | None
    """``DisruptionTarget`` condition reason (``kube_pod_status_disruption_reason``)."""
    status_delay_s: int
    """The status reason is set this long after the condition (kubelet: after the kill)."""
    lifetime_s: int | None
    """The pod object is deleted this long after the disruption; None: lingers (Failed)."""
    burst_per_minute: float
    """Share of a minute's disruptions that happen at one instant (a node's pods at once)."""


KINDS = (
    Kind("scheduler-preemption", "preemption", "PreemptionByScheduler", "PreemptionByScheduler",
         0, 45, 0),
    Kind("kubelet-eviction", "kubelet", "Evicted", "TerminationByKubelet", 40, None, 0),
    Kind("kubectl-drain", "eviction-api", None, "EvictionByEvictionAPI", 0, 45, 0),
    Kind("karpenter-consolidation", "eviction-api", None, "EvictionByEvictionAPI", 0, 45, 0.5),
    Kind("spot-interruption", "eviction-api", None, "EvictionByEvictionAPI", 0, 90, 1.0),
    Kind("node-unreachable", "node", None, "DeletionByTaintManager", 0, 300, 0.5),
)  # fmt: skip
RATES = (6, 12)
WITHOUT_CONDITION = ("scheduler-preemption", "kubelet-eviction", "kubectl-drain")
"""The kinds checked on releases without ``kube_pod_status_disruption_reason``."""


def visible(kind: Kind, ksm: Ksm, policy: PoolPolicy) -> bool:
    """Whether this release reports the kind under a reason the policy counts."""
    m = policy.metrics
    by_status = kind.status in ksm.status_reasons and kind.status in m.eviction_reasons
    by_condition = ksm.disruption and kind.disruption in m.disruption_reasons
    return by_status or by_condition


def disruption_times(kind: Kind, rate: int, start: int, stop: int) -> list[int]:
    """Disruption instants at ``rate`` per minute in [start, stop), bursts per ``kind``."""
    burst = max(1, round(rate * kind.burst_per_minute))
    period = 60 * burst / rate
    times: list[int] = []
    k = 0
    while (t := start + 3 + round(k * period)) < stop:
        times += [t] * burst
        k += 1
    return times


@dataclass(frozen=True)
class Pod:
    name: str
    kind: Kind
    at: int
    """When the disruption starts (the condition is set)."""
    status_as: str | None = None
    """Overrides ``kind.status`` (a pod with a second raw reason)."""
    lifetime_s: int | None = -1
    """Overrides ``kind.lifetime_s`` where not -1."""


def _values(samples: list[tuple[int, str]], interval_s: int) -> str:
    """promtool values at ``interval_s``: the samples (at multiples of it), ``_`` between."""
    tokens, slot = [], 0
    for at, value in samples:
        index, off_grid = divmod(at, interval_s)
        assert not off_grid, f"sample at {at} s is off the {interval_s} s input grid"
        if index > slot:  # `_xN` is N missing samples (unlike `vxN`, N + 1 values)
            tokens.append(f"_x{index - slot}" if index - slot > 1 else "_")
        tokens.append(value)
        slot = index + 1
    return " ".join(tokens)


def _series(
    metric: str, labels: dict[str, str], samples: list[tuple[int, str]], interval_s: int
) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{body}}}", "values": _values(samples, interval_s)}


def _rows(alive: list[int], after: list[int], on: int, dense: bool) -> list[tuple[int, str]]:
    """One reason row: 1 from ``on`` (0 before where dense), ``stale`` once the pod is gone."""
    kept = [(s, "1" if s >= on else "0") for s in alive if dense or s >= on]
    return kept + [(s, "stale") for s in after] if kept else []


def input_series(pods: list[Pod], ksm: Ksm, timing: Timing, end: int) -> list[dict[str, str]]:
    """What Prometheus scraped from this KSM release for ``pods`` (plus one Running pod)."""
    scrapes = range(timing.offset_s, end + 1, timing.scrape_s)
    step = timing.interval_s
    out = [
        _series(
            "kube_pod_status_phase",
            {"namespace": NS, "pod": "survivor", "phase": "Running"},
            [(s, "1") for s in scrapes],
            step,
        )
    ]
    for pod in pods:
        created = max(0, pod.at - POD_AGE_S)
        lifetime = pod.kind.lifetime_s if pod.lifetime_s == -1 else pod.lifetime_s
        gone = end + 1 if lifetime is None else pod.at + lifetime
        alive = [s for s in scrapes if created <= s < gone]
        after = [s for s in scrapes if s >= gone][:1]
        key = {"namespace": NS, "pod": pod.name, **({"uid": f"u-{pod.name}"} if ksm.uid else {})}
        status = pod.status_as or pod.kind.status
        status = status if status in ksm.status_reasons else None
        status_on = pod.at + pod.kind.status_delay_s

        dense_rows = [r for r in ksm.status_reasons if r in DENSE_ROWS]
        for reason in dense_rows if ksm.dense else [status] if status else []:
            on = status_on if reason == status else gone
            samples = _rows(alive, after, on, ksm.dense)
            if samples:
                labels = {**key, "reason": reason}
                out.append(_series("kube_pod_status_reason", labels, samples, step))
        if ksm.disruption and pod.kind.disruption:
            samples = _rows(alive, after, pod.at, dense=False)
            if samples:
                labels = {**key, "reason": pod.kind.disruption}
                out.append(_series("kube_pod_status_disruption_reason", labels, samples, step))
    return out


def grid(t: float, timing: Timing, up: bool) -> int:
    """``t`` rounded to promtool's evaluation grid."""
    step = timing.eval_s
    return int((math.ceil(t / step) if up else math.floor(t / step)) * step)


def within(expected: float, at: int, exact: bool = False) -> dict[str, Any]:
    """promql_expr_test: the namespace's total is within TOLERANCE of ``expected`` (exactly
    0 where 0 is expected: present, not absent; ``exact``: to float rounding)."""
    tolerance = EXACT if exact else TOLERANCE * expected
    return {
        "expr": f"abs({TOTAL} - {float(expected)}) <= bool {tolerance}",
        "eval_time": f"{at}s",
        "exp_samples": [{"labels": f'{{namespace="{NS}"}}', "value": 1}],
    }


def per_reason_within(expected: dict[str, float], at: int, exact: bool = False) -> dict[str, Any]:
    """Every canonical reason's row is within TOLERANCE of its expected rate (0: exactly)."""
    vector = " or ".join(
        f'label_replace(vector({float(value)}), "reason", "{reason}", "", "")'
        for reason, value in expected.items()
    )
    tolerance = str(EXACT) if exact else f"on (reason) ({TOLERANCE} * ({vector}))"
    return {
        "expr": f"abs({REC} - on (reason) ({vector})) <= bool {tolerance}",
        "eval_time": f"{at}s",
        "exp_samples": [{"labels": f'{{reason="{r}"}}', "value": 1} for r in expected],
    }


def firing(at: int, expected: bool) -> dict[str, Any]:
    return {
        "expr": FIRING,
        "eval_time": f"{at}s",
        "exp_samples": [{"labels": _alert_labels(), "value": 1}] if expected else [],
    }


def _alert_labels() -> str:
    labels = {
        "__name__": "ALERTS",
        "alertname": "FlexEvictionRateHigh",
        "alertstate": "firing",
        "cluster": "test-cluster",
        "gpupool_tuner": "true",
        "namespace": NS,
        "severity": "warning",
    }
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@dataclass
class Knobs:
    window: int
    limit: float
    for_s: int
    keep_s: int
    reasons: list[str]


@pytest.fixture(scope="module")
def knobs(test_policy: PoolPolicy) -> Knobs:
    t = test_policy.alerting.thresholds.flex_eviction_rate
    assert t.keep_firing_for is not None, "the test policy must keep the alert firing"
    return Knobs(
        int(duration_seconds(test_policy.metrics.rate_window)),
        t.per_minute_max,
        int(duration_seconds(t.for_)),
        int(duration_seconds(t.keep_firing_for)),
        canonical_reasons(test_policy),
    )


@pytest.fixture(scope="module")
def eviction_rules(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated eviction recording rule and alert group, nothing else: promtool's time
    grows with rules x series x evaluation steps, and no other rule reads these series."""
    yaml = YAML(typ="safe")
    catalogue = yaml.load((bundle / "rules" / "catalogue.yaml").read_text())
    recording = [r for g in catalogue["groups"] for r in g["rules"] if r.get("record") == REC]
    assert len(recording) == 1
    alerting = yaml.load((bundle / "rules" / "evictions.yaml").read_text())["groups"]
    path = tmp_path_factory.mktemp("eviction-rules") / "evictions.yaml"
    path.write_text(json.dumps({"groups": [{"name": "recording", "rules": recording}, *alerting]}))
    return path


def _pods(kind: Kind, rate: int, start: int, stop: int) -> list[Pod]:
    times = disruption_times(kind, rate, start, stop)
    return [Pod(f"{kind.name}-{i}", kind, at) for i, at in enumerate(times)]


def _lag(kind: Kind, ksm: Ksm, timing: Timing) -> int:
    """Seconds until a disruption is in a scrape (the status reason comes 40 s late for
    kubelet victims; from v2.20 the condition shows at once)."""
    return (0 if ksm.disruption else kind.status_delay_s) + timing.scrape_s


def rate_case(
    kind: Kind, rate: int, ksm: Ksm, timing: Timing, policy: PoolPolicy, k: Knobs
) -> dict[str, Any]:
    """``kind`` at ``rate`` from T0: at every evaluation once the window holds only
    disruptions, the total and each reason's row are within 5 % of what the release sees."""
    seen = rate if visible(kind, ksm, policy) else 0
    ready = grid(T0 + _lag(kind, ksm, timing) + k.window, timing, up=True)
    stop = ready + STEADY_S
    expected = {r: float(seen if r == kind.reason else 0) for r in k.reasons}
    checks: list[dict[str, Any]] = []
    for at in range(ready, stop + 1, timing.eval_s):
        checks += [within(seen, at), per_reason_within(expected, at)]
    return {
        "name": f"{kind.name} at {rate}/min on {ksm.name}, {timing.name}",
        "interval": f"{timing.interval_s}s",
        "input_series": input_series(_pods(kind, rate, T0, stop), ksm, timing, stop),
        "promql_expr_test": checks,
    }


def alert_case(
    kind: Kind, rate: int, ksm: Ksm, timing: Timing, policy: PoolPolicy, k: Knobs
) -> dict[str, Any]:
    """``kind`` at ``rate`` from T0 to T1, then nothing: the alert's whole life.

    The rate passes the limit about T0 + window x limit / rate (earlier by up to a burst,
    later by the lag, a scrape and the alert reading the recording one evaluation late) and
    the alert fires ``for`` later; after T1 the rate drops below the limit about
    window x (1 - limit / rate) later, the alert keeps firing ``keep_firing_for``, resolves.
    """
    seen = rate if visible(kind, ksm, policy) else 0
    lag = _lag(kind, ksm, timing)
    fill, drain = k.window * k.limit / rate, k.window * (1 - k.limit / rate)
    late = lag + timing.scrape_s + 2 * timing.eval_s + 5
    early = 60 + timing.scrape_s
    quiet_at = grid(T0 + fill + k.for_s - early, timing, up=False)
    fire_at = grid(T0 + fill + k.for_s + late, timing, up=True)
    below_at = grid(T1 + drain + lag + timing.scrape_s + 5, timing, up=True)
    resolve_at = grid(T1 + drain + k.keep_s + late + timing.eval_s, timing, up=True)
    assert quiet_at < fire_at < T1 < below_at < T1 + drain - early + k.keep_s - timing.eval_s
    checks = [
        firing(quiet_at, False),
        firing(fire_at, seen > 0),
        within(seen, T1),
        firing(below_at, seen > 0),
        {  # firing there although the rate is below the limit: keep_firing_for holds it
            "expr": f"{TOTAL} < bool {k.limit}",
            "eval_time": f"{below_at}s",
            "exp_samples": [{"labels": f'{{namespace="{NS}"}}', "value": 1}],
        },
        firing(resolve_at, False),
    ]
    end = resolve_at + timing.eval_s
    return {
        "name": f"alert: {kind.name} at {rate}/min on {ksm.name}, {timing.name}",
        "interval": f"{timing.interval_s}s",
        "input_series": input_series(_pods(kind, rate, T0, T1), ksm, timing, end),
        "promql_expr_test": checks,
    }


def run_promtool(tmp_path: Path, rules: Path, timing: Timing, cases: list[dict[str, Any]]) -> None:
    test = {"rule_files": [str(rules)], "evaluation_interval": f"{timing.eval_s}s", "tests": cases}
    path = tmp_path / "shapes.test.yaml"
    path.write_text(json.dumps(test))
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


RATE_RUNS = [
    (ksm, timing)
    for ksm in SHAPES
    for timing in (TIMINGS if ksm in (KSM_2_19, KSM_2_20_DISRUPTION) else TIMINGS[:2])
]
"""Every release on the two unaligned timings of the brief; a dense and the fullest sparse
release also on 15 s scrapes and on aligned evaluation (a sample at exactly T - window)."""


@pytest.mark.parametrize(("ksm", "timing"), RATE_RUNS, ids=lambda v: v.name)
def test_rate_is_within_5_percent_on_every_shape(
    ksm: Ksm,
    timing: Timing,
    test_policy: PoolPolicy,
    knobs: Knobs,
    eviction_rules: Path,
    tmp_path: Path,
) -> None:
    """Every kind at 6 and 12 a minute. Without the disruption series the Eviction-API and
    taint-manager kinds write the same rows (none, or dense 0 rows), so one stands for all."""
    kinds = KINDS if ksm.disruption else [k for k in KINDS if k.name in WITHOUT_CONDITION]
    cases = [
        rate_case(kind, rate, ksm, timing, test_policy, knobs) for kind in kinds for rate in RATES
    ]
    run_promtool(tmp_path, eviction_rules, timing, cases)


ALERT_RUNS = (
    (KSM_2_18, "kubelet-eviction", "scheduler-preemption", TIMINGS[0]),
    (KSM_2_19, "scheduler-preemption", "kubectl-drain", TIMINGS[1]),
    (KSM_2_20, "scheduler-preemption", "spot-interruption", TIMINGS[0]),
    (KSM_2_20_DISRUPTION, "spot-interruption", "kubectl-drain", TIMINGS[1]),
)
"""(release, a kind it sees, another kind, timing): the alert's life for both, at each rate;
on KSM >= 2.20 with the disruption series both fire."""


@pytest.mark.parametrize(
    ("ksm", "kind_a", "kind_b", "timing"), ALERT_RUNS, ids=lambda v: getattr(v, "name", v)
)
def test_alert_fires_keeps_firing_and_resolves(
    ksm: Ksm,
    kind_a: str,
    kind_b: str,
    timing: Timing,
    test_policy: PoolPolicy,
    knobs: Knobs,
    eviction_rules: Path,
    tmp_path: Path,
) -> None:
    kinds = {k.name: k for k in KINDS}
    cases = [
        alert_case(kinds[name], rate, ksm, timing, test_policy, knobs)
        for name in (kind_a, kind_b)
        for rate in RATES
    ]
    run_promtool(tmp_path, eviction_rules, timing, cases)


def test_the_matrix_sees_what_each_release_reports(test_policy: PoolPolicy) -> None:
    """The shapes above differ where docs/alerts.md says they do (guards the matrix itself)."""
    seen = {
        ksm.name: sorted(kind.name for kind in KINDS if visible(kind, ksm, test_policy))
        for ksm in SHAPES
    }
    assert seen == {
        KSM_2_18.name: ["kubelet-eviction"],
        KSM_2_19.name: ["kubelet-eviction", "scheduler-preemption"],
        KSM_2_20.name: ["kubelet-eviction", "scheduler-preemption"],
        KSM_2_20_DISRUPTION.name: sorted(kind.name for kind in KINDS),
    }


def _burst(kind: Kind, n: int, at: int, **pod: Any) -> list[Pod]:
    return [Pod(f"{kind.name}-burst-{i}", kind, at, **pod) for i in range(n)]


def _first_scrape(t: int, timing: Timing) -> int:
    return next(s for s in range(timing.offset_s, 10**6, timing.scrape_s) if s >= t)


@pytest.fixture(params=TIMINGS[:2], ids=lambda t: t.name)
def timing(request: pytest.FixtureRequest) -> Iterator[Timing]:
    yield request.param


def test_lingering_failed_pods_count_once(
    timing: Timing, knobs: Knobs, eviction_rules: Path, tmp_path: Path
) -> None:
    """20 pods evicted at once stay Failed (value 1) for three windows: counted as
    20 / window while their first sample is in the window, 0 in every later evaluation (also
    once the offset window no longer holds that first sample), on every shape."""
    kubelet = next(k for k in KINDS if k.name == "kubelet-eviction")
    n, at = 20, 125
    end = at + kubelet.status_delay_s + 3 * knobs.window + timing.scrape_s
    cases = []
    for ksm in SHAPES:
        first = _first_scrape(at + (0 if ksm.disruption else kubelet.status_delay_s), timing)
        counted = range(grid(first, timing, up=True), first + knobs.window, timing.eval_s)
        later = range(grid(first + knobs.window, timing, up=True), end, timing.eval_s)
        assert len(counted) >= 4 and later[-1] > first + 2 * knobs.window
        checks = [within(n * 60 / knobs.window, t) for t in counted]
        checks += [within(0, t) for t in later]
        checks.append(
            {
                "expr": 'count(kube_pod_status_reason{reason="Evicted"} == 1)',
                "eval_time": f"{end}s",
                "exp_samples": [{"labels": "{}", "value": n}],
            }
        )
        cases.append(
            {
                "name": f"lingering Failed pods on {ksm.name}, {timing.name}",
                "interval": f"{timing.interval_s}s",
                "input_series": input_series(_burst(kubelet, n, at), ksm, timing, end),
                "promql_expr_test": checks,
            }
        )
    run_promtool(tmp_path, eviction_rules, timing, cases)


def test_a_pod_in_both_sources_counts_once(
    timing: Timing, knobs: Knobs, eviction_rules: Path, tmp_path: Path
) -> None:
    """KSM >= 2.20: kubelet victims carry DisruptionTarget (TerminationByKubelet) at once and
    ``status.reason=Evicted`` 40 s later; drained pods that also show ``Evicted`` count once
    under the higher-precedence ``eviction-api``. Between "the condition left the window" and
    "the status reason left it" a per-source count would count the pods a second time."""
    kinds = {k.name: k for k in KINDS}
    kubelet, drain = kinds["kubelet-eviction"], kinds["kubectl-drain"]
    n, at = 10, 125
    end = at + 3 * knobs.window
    condition, status = _first_scrape(at, timing), _first_scrape(at + 40, timing)
    assert status > condition, "the two sources must first appear at different scrapes"
    pods = _burst(kubelet, n, at) + [
        Pod(f"drained-{i}", drain, at, status_as="Evicted", lifetime_s=None) for i in range(n)
    ]
    rate = 2 * n * 60 / knobs.window
    each = n * 60 / knobs.window
    both = range(grid(status, timing, up=True), condition + knobs.window, timing.eval_s)
    straddle = range(grid(condition + knobs.window, timing, up=True), end, timing.eval_s)
    assert len(both) >= 2 and len(straddle) >= 2
    counted = {r: each if r in ("kubelet", "eviction-api") else 0.0 for r in knobs.reasons}
    checks = [within(rate, t) for t in both]
    checks += [per_reason_within(counted, t) for t in both]
    checks += [within(0, t) for t in straddle]
    checks.append(
        {  # both families really hold the pods then
            "expr": "count(kube_pod_status_reason == 1) + count(kube_pod_status_disruption_reason)",
            "eval_time": f"{straddle[0]}s",
            "exp_samples": [{"labels": "{}", "value": 4 * n}],
        }
    )
    case = {
        "name": f"both sources, {timing.name}",
        "interval": f"{timing.interval_s}s",
        "input_series": input_series(pods, KSM_2_20_DISRUPTION, timing, end),
        "promql_expr_test": checks,
    }
    run_promtool(tmp_path, eviction_rules, timing, [case])


def test_mixed_reasons_split_and_sum(
    timing: Timing, test_policy: PoolPolicy, knobs: Knobs, eviction_rules: Path, tmp_path: Path
) -> None:
    """Preemption 6/min + Karpenter consolidation 6/min: 6 and 6 by reason, 12 in total."""
    kinds = {k.name: k for k in KINDS}
    pods: list[Pod] = []
    for name in ("scheduler-preemption", "karpenter-consolidation"):
        kind = kinds[name]
        pods += [
            Pod(f"{name}-{i}", kind, t) for i, t in enumerate(disruption_times(kind, 6, T0, T1))
        ]
    ready = grid(T0 + timing.scrape_s + knobs.window, timing, up=True)
    expected = {r: 6.0 if r in ("preemption", "eviction-api") else 0.0 for r in knobs.reasons}
    checks = []
    for t in range(ready, grid(T1, timing, up=False) + 1, timing.eval_s):
        checks += [within(12, t), per_reason_within(expected, t)]
    case = {
        "name": f"mixed, {timing.name}",
        "interval": f"{timing.interval_s}s",
        "input_series": input_series(pods, KSM_2_20_DISRUPTION, timing, T1),
        "promql_expr_test": checks,
    }
    run_promtool(tmp_path, eviction_rules, timing, [case])


def first_seen(pod: Pod, ksm: Ksm, timing: Timing, policy: PoolPolicy) -> int | None:
    """The scrape that first shows ``pod`` disrupted under a counted reason (None: never)."""
    m, kind = policy.metrics, pod.kind
    lifetime = kind.lifetime_s if pod.lifetime_s == -1 else pod.lifetime_s
    gone = math.inf if lifetime is None else pod.at + lifetime
    status, on = pod.status_as or kind.status, []
    if status in ksm.status_reasons and status in m.eviction_reasons:
        on.append(pod.at + kind.status_delay_s)
    if ksm.disruption and kind.disruption in m.disruption_reasons:
        on.append(pod.at)
    return min((s for t in on if (s := _first_scrape(t, timing)) < gone), default=None)


def test_random_arrivals_count_exactly_the_pods_first_seen_in_the_window(
    test_policy: PoolPolicy, knobs: Knobs, eviction_rules: Path, tmp_path: Path
) -> None:
    """Poisson arrivals (seeded) at 12 a minute, of random kinds, on KSM >= 2.20 with the
    disruption series: at every evaluation each reason's row is the number of pods whose
    first disruption sample lies in (T - window, T], per window minute: the definition,
    worked out here from the scenario, not from the query."""
    rng, timing = random.Random(2020), TIMINGS[0]
    pods: list[Pod] = []
    t = float(T0)
    while (t := t + rng.expovariate(12 / 60)) < T1:
        pods.append(Pod(f"random-{len(pods)}", rng.choice(KINDS), int(t)))
    seen = [(pod, first_seen(pod, KSM_2_20_DISRUPTION, timing, test_policy)) for pod in pods]
    assert all(s is not None for _, s in seen), "every kind is visible on this release"
    checks = []
    for at in range(grid(T0, timing, up=True), T1 + 1, timing.eval_s):
        counts = dict.fromkeys(knobs.reasons, 0)
        for pod, s in seen:
            if s is not None and at - knobs.window < s <= at:
                counts[pod.kind.reason] += 1
        per_minute = {r: n * 60 / knobs.window for r, n in counts.items()}
        checks += [
            per_reason_within(per_minute, at, exact=True),
            within(sum(counts.values()) * 60 / knobs.window, at, exact=True),
        ]
    case = {
        "name": f"{len(pods)} random arrivals, {timing.name}",
        "interval": f"{timing.interval_s}s",
        "input_series": input_series(pods, KSM_2_20_DISRUPTION, timing, T1),
        "promql_expr_test": checks,
    }
    run_promtool(tmp_path, eviction_rules, timing, [case])


@pytest.mark.parametrize("interval_s", [1, 5])
def test_the_scrape_model_puts_samples_at_scrape_instants(
    interval_s: int, eviction_rules: Path, tmp_path: Path
) -> None:
    """The input encoding itself: a sample written for 25 s is there at 25 s, not before."""
    samples = [(5, "1"), (25, "2"), (30, "3"), (60, "stale")]
    case = {
        "interval": f"{interval_s}s",
        "input_series": [_series("x", {"k": "v"}, samples, interval_s)],
        "promql_expr_test": [
            {"expr": "timestamp(x)", "eval_time": f"{at}s", "exp_samples": samples_}
            for at, samples_ in (
                (20, [{"labels": '{k="v"}', "value": 5}]),
                (25, [{"labels": '{k="v"}', "value": 25}]),
                (55, [{"labels": '{k="v"}', "value": 30}]),
                (60, []),
            )
        ],
    }
    run_promtool(tmp_path, eviction_rules, Timing(30, 0, 30), [case])


@pytest.mark.parametrize(
    ("field", "reasons", "problem"),
    [
        ("eviction_reasons", [], "eviction_reasons"),
        ("disruption_reasons", [], "disruption_reasons"),
        ("eviction_reasons", ["Evicted|.*"], "eviction_reasons.0"),
        ("disruption_reasons", ["EvictionByEvictionAPI", 'x"}'], "disruption_reasons.1"),
        ("eviction_reasons", ["Evicted", "Evicted"], "eviction_reasons"),
    ],
)
def test_reason_lists_are_non_empty_identifiers(
    test_policy: PoolPolicy, field: str, reasons: list[str], problem: str
) -> None:
    """The reasons go into a PromQL regex: only identifiers, each once, at least one."""
    document = test_policy.model_dump(by_alias=True, mode="json")
    document["metrics"][field] = reasons
    with pytest.raises(PolicyError) as failed:
        parse_policy(document)
    assert any(p.path == f"metrics.{problem}" for p in failed.value.problems), failed.value
