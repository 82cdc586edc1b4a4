"""Flex pod disruptions per minute, by canonical reason, from kube-state-metrics (KSM).

Two KSM families report that a pod was disrupted; both are keyed by ``namespace`` and
``pod`` (and ``uid`` where the release adds it; the query works with or without it):

- ``kube_pod_status_reason{reason}`` (the pod's ``status.reason``). Up to v2.19 it is a
  DENSE 0/1 gauge: one row per pod and known reason (``Evicted``, ``NodeAffinity``,
  ``NodeLost``, ``Shutdown``, ``UnexpectedAdmissionError``; v2.19 adds
  ``PreemptionByScheduler`` and may show ``TerminationByKubelet``), 1 while the reason holds.
  From v2.20 it is SPARSE: only the row of the reason that holds, always 1, no 0 rows.
- ``kube_pod_status_disruption_reason{reason}`` (the ``DisruptionTarget`` condition; ALPHA,
  v2.20 and later, sparse): ``EvictionByEvictionAPI`` (drains, Karpenter consolidation, drift
  and spot interruption: visible nowhere else), ``PreemptionByScheduler``,
  ``TerminationByKubelet``, ``DeletionByTaintManager``, ``DeletionByPodGC``.

A row lives as long as the pod object: a kubelet-evicted pod lingers as ``Failed`` for hours,
a preempted or drained pod's row lasts its grace period (~45 s) before the pod is deleted.

What is counted: distinct flex pods whose first disruption sample (value 1, in either
family, for a reason the policy lists) falls in the rate window ``w``::

    recent  = pods with a 1 in [T-w, T]          max_over_time(S[w]) == 1
    before  = pods with a 1 in [T-2w, T-w]       max_over_time(S[w] offset w) == 1
    counted = recent unless on (namespace, pod, uid) before

``== 1`` drops the 0 rows of the dense shape, so one query fits every release; ``before``
drops lingering ``Failed`` pods (counted once, in the windows where they first appeared).
Both families are merged per pod BEFORE the ``unless``: a pod whose ``DisruptionTarget``
row appears a scrape before its ``Evicted`` row is one pod with one first appearance, never
one per family.

Why this is exact with unaligned evaluation: every sample sits at a scrape instant, and a
pod counts at T exactly when its first 1 sample lies in (T-w, T] (in Prometheus 2.x both
windows are closed, so a sample at exactly T-w is in ``before`` and was counted by the
evaluations before T; 3.x windows are left-open, same result). A half-open interval of
length ``w`` holds exactly ``w / scrape_interval`` scrapes whatever the evaluation offset, so
at a steady rate the count is exactly ``rate x w`` (the old ``max - min`` lost the first
scrape of every unaligned window: -1/10 at 5m/30s). ``w`` must be a whole number of scrape
intervals, else the count alternates between the two neighbouring numbers of scrapes (the
mean stays right). Each pod is counted by every evaluation whose window holds its first
sample, like ``rate()``: the series is a sliding per-minute rate, not a sum of disjoint
buckets.

Canonical reasons (label ``reason`` of the result; ``REASON_OF`` maps raw reasons, anything
unknown is ``other``). A pod carrying raw reasons of several canonical reasons in the window
counts ONCE, under the first in ``PRECEDENCE`` (who started the disruption, most specific
first): ``preemption`` > ``eviction-api`` > ``kubelet`` > ``node`` > ``other``.

Every canonical reason some listed raw reason maps to has a row in every namespace with flex
pods (0 when nothing happened), so alerts and the tuner see 0, never absence.
"""

from __future__ import annotations

from policy.base import duration_seconds
from policy.pool import PoolPolicy

STATUS_REASON = "kube_pod_status_reason"
DISRUPTION_REASON = "kube_pod_status_disruption_reason"

POD_KEY = "namespace, pod, uid"
"""Labels that identify one pod object (``uid`` is empty, and harmless, where KSM omits it)."""

PREEMPTION, EVICTION_API, KUBELET, NODE, OTHER = (
    "preemption",
    "eviction-api",
    "kubelet",
    "node",
    "other",
)
PRECEDENCE = (PREEMPTION, EVICTION_API, KUBELET, NODE, OTHER)
"""Canonical reasons, highest precedence first: a pod counts once, under the first that
applies."""

REASON_OF: dict[str, str] = {
    "PreemptionByScheduler": PREEMPTION,
    "EvictionByEvictionAPI": EVICTION_API,
    "Evicted": KUBELET,
    "TerminationByKubelet": KUBELET,
    "DeletionByTaintManager": NODE,
    "DeletionByPodGC": NODE,
    "NodeLost": NODE,
    "Shutdown": NODE,
}
"""Raw KSM reason (either family) -> canonical ``reason`` label; unlisted reasons are
``other`` (``NodeAffinity``, ``UnexpectedAdmissionError``, anything a policy adds)."""


def canonical_reason(raw: str) -> str:
    """The canonical ``reason`` label a raw KSM reason is recorded under."""
    return REASON_OF.get(raw, OTHER)


def _num(value: float) -> str:
    return repr(float(value))


def _selector(metric: str, namespace: str, reasons: list[str]) -> str:
    return f'{metric}{{namespace="{namespace}", reason=~"{"|".join(reasons)}"}}'


def _held(namespace: str, status: list[str], disruption: list[str], window: str) -> str:
    """Pods (by ``POD_KEY``, value 1) with a 1 sample of one of the reasons in ``window``."""
    parts = [
        f"(max_over_time({_selector(metric, namespace, reasons)}{window}) == 1)"
        for metric, reasons in ((STATUS_REASON, status), (DISRUPTION_REASON, disruption))
        if reasons
    ]
    return f"max by ({POD_KEY}) ({' or '.join(parts)})"


def _labelled(expr: str, reason: str) -> str:
    return f'label_replace({expr}, "reason", "{reason}", "", "")'


def canonical_reasons(policy: PoolPolicy) -> list[str]:
    """Canonical reasons the policy's raw reasons map to, in ``PRECEDENCE`` order."""
    m = policy.metrics
    present = {canonical_reason(r) for r in [*m.eviction_reasons, *m.disruption_reasons]}
    return [c for c in PRECEDENCE if c in present]


def flex_evictions_expr(policy: PoolPolicy) -> str:
    """PromQL of ``gpupool:flex_evictions:per_minute{namespace, reason}`` (module docstring)."""
    m, ns = policy.metrics, policy.cluster.flex_namespace
    w = m.rate_window
    recent = f"[{w}]"
    labelled = []
    for reason in canonical_reasons(policy):
        status = [r for r in m.eviction_reasons if canonical_reason(r) == reason]
        disruption = [r for r in m.disruption_reasons if canonical_reason(r) == reason]
        labelled.append(f"({_labelled(_held(ns, status, disruption, recent), reason)})")
    one_reason_per_pod = f" or on ({POD_KEY}) ".join(labelled)
    before = _held(ns, m.eviction_reasons, m.disruption_reasons, f"[{w}] offset {w}")
    first_seen = f"({one_reason_per_pod}) unless on ({POD_KEY}) ({before})"
    minutes = _num(duration_seconds(w) / 60)
    counts = f"sum by (namespace, reason) ({first_seen}) / {minutes}"
    zero = f'0 * sum by (namespace) (kube_pod_status_phase{{namespace="{ns}"}})'
    zeros = " or ".join(f"({_labelled(zero, r)})" for r in canonical_reasons(policy))
    return f"({counts}) or ({zeros})"
