"""Where gpupool's metrics come from: label names, query windows and evaluation cadence.

These values depend on how the cluster's exporters are deployed (dcgm-exporter's node label,
how the flex vLLM pods are scraped); the metrics catalogue reads them instead of literals.
"""

from __future__ import annotations

import re
import warnings
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from policy.base import (
    Duration,
    Invariants,
    LabelKey,
    LabelValue,
    PrometheusLabel,
    StrictModel,
    duration_seconds,
)

_REASON = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
"""A pod status or disruption reason: an identifier, so it is safe inside a PromQL regex."""


_JOB_REGEX = re.compile(r"[-A-Za-z0-9_.*+?|()\[\]^$:/]{1,256}", re.ASCII)
"""What a ``job`` regex may hold: ASCII job-name characters and the RE2 operators both
Prometheus (RE2) and Python read alike; no ``"`` or ``\\`` (it sits in a PromQL string),
no ``{`` (counted repetition), no ``(?`` (flags, names, lookaround: Python-only or
RE2-only), no possessive ``*+`` (Python-only)."""


def _check_job_regex(value: str) -> str:
    problem = None
    if _JOB_REGEX.fullmatch(value) is None:
        problem = "ASCII letters, digits and - _ . * + ? | ( ) [ ] ^ $ : / (at most 256)"
    elif "(?" in value or re.search(r"[*+?]\+", value):
        problem = "no (? groups or possessive *+ ++ ?+ (Prometheus' RE2 has neither)"
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # FutureWarning: an ambiguous set like [[a]
                re.compile(value)
        except (re.error, FutureWarning) as exc:
            problem = f"a valid regular expression ({exc})"
    if problem is not None:
        raise ValueError(
            f"expected a job regex of {problem}, e.g. .*dcgm-exporter.*, found {value!r}"
        )
    return value


JobRegex = Annotated[str, AfterValidator(_check_job_regex)]
"""A Prometheus ``job`` label regex (``up{job=~"<it>"}``) valid for RE2 and Python alike."""


class MetricSources(StrictModel):
    """Label names and windows of the series the catalogue queries."""

    gpu_node_label: PrometheusLabel = "Hostname"
    """dcgm-exporter label holding the node name (``Hostname``; ``hostname`` in its newest
    releases); joins each GPU to its node pool through kube-state-metrics' ``kube_node_labels``."""
    gpu_pod_labels: tuple[PrometheusLabel, PrometheusLabel] = ("namespace", "pod")
    """dcgm-exporter labels naming the namespace and pod that hold a GPU (its Kubernetes
    mode, on by default in its Helm chart). With ``honorLabels: false`` on the scrape they
    arrive as ``exported_namespace`` and ``exported_pod``: set them here. Production's GPU
    utilization, the elastic signal, is joined to pods through them."""
    gpu_resource: str = Field("nvidia_com_gpu", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    """kube-state-metrics' ``resource`` label of the GPU extended resource (``nvidia.com/gpu``
    is exported as ``nvidia_com_gpu``; AMD: ``amd_com_gpu``). Headroom is allocatable minus
    requested of this resource."""
    dcgm_job: JobRegex = ".*dcgm-exporter.*"
    """Prometheus ``job`` label of the dcgm-exporter scrape targets, a regex matched whole
    (``up{job=~"<dcgm_job>"}``): GPUExporterDown watches each target's ``up``. The job is
    named after the scraped Service: ``nvidia-dcgm-exporter`` under the GPU operator,
    ``<release>-dcgm-exporter`` (or ``dcgm-exporter``) with dcgm-exporter's own Helm chart,
    which the default matches. GpupoolMetricMissing fires when GPU series arrive but no
    ``up`` series matches, so a wrong value is reported, not silent."""
    workload_label: PrometheusLabel = "workload"
    """Target label naming the flex workload on scraped vLLM series (set by the scrape config,
    e.g. a PodMonitor relabeling the pod's ``app.kubernetes.io/name``)."""
    instance_labels: list[PrometheusLabel] = Field(
        default_factory=lambda: ["namespace", "workload", "pod"], min_length=1
    )
    """Labels that identify one vLLM instance; per-instance series (KV usage, hit rate,
    preemptions) are aggregated by these, so several engines of one pod count as one."""
    rate_window: Duration = "5m"
    """Window of every ``rate()`` in the catalogue (hit rate, preemptions, evictions); at least
    four scrape intervals so a missed scrape does not blank the series."""
    evaluation_interval: Duration = "30s"
    """How often Prometheus evaluates gpupool's recording and alerting rules."""
    eviction_reasons: list[str] = Field(
        default_factory=lambda: ["Evicted", "PreemptionByScheduler", "TerminationByKubelet"],
        min_length=1,
    )
    """``reason`` values of kube-state-metrics' ``kube_pod_status_reason`` that count as a
    flex disruption. Every release reports ``Evicted`` (kubelet node-pressure eviction; the
    pod lingers as ``Failed``); v2.19 adds ``PreemptionByScheduler`` (scheduler preemption
    victims) and may report ``TerminationByKubelet``. Up to v2.19 the gauge is dense (a 0/1
    row per pod and known reason), from v2.20 sparse (only the reason that holds, value 1).
    Eviction-API disruptions (drains, Karpenter) never appear here: see
    ``disruption_reasons``. Other known reasons (``NodeLost``, ``Shutdown``, ``NodeAffinity``,
    ``UnexpectedAdmissionError``) may be added; unknown ones count under ``reason="other"``."""
    disruption_reasons: list[str] = Field(
        default_factory=lambda: [
            "EvictionByEvictionAPI",
            "PreemptionByScheduler",
            "TerminationByKubelet",
            "DeletionByTaintManager",
        ],
        min_length=1,
    )
    """``reason`` values of kube-state-metrics' ``kube_pod_status_disruption_reason`` (the
    pod's ``DisruptionTarget`` condition; ALPHA, v2.20 and later, sparse) that count as a flex
    disruption. ``EvictionByEvictionAPI`` (``kubectl drain``, Karpenter consolidation, drift
    and spot interruption) is visible nowhere else; ``PreemptionByScheduler`` and
    ``TerminationByKubelet`` repeat what ``kube_pod_status_reason`` may already report (each
    pod counts once); ``DeletionByTaintManager`` is a pod deleted off a NoExecute-tainted
    (unreachable or NotReady) node. ``DeletionByPodGC`` is left out by default: PodGC collects
    pods whose node object is already gone, after the disruption the other reasons (or the
    node's failure) already caused; add it to count orphaned pods of vanished nodes too.
    Before v2.20 the series does not exist and this list selects nothing."""
    alertmanager_config_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Labels put on the ``AlertmanagerConfig`` so the Alertmanager's
    ``alertmanagerConfigSelector`` picks it up (kube-prometheus-stack: ``release: <helm
    release>``, or whatever ``alertmanagerConfigSelector`` says)."""
    rule_selector_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Labels put on the PrometheusRule and dashboard so the operator's ``ruleSelector`` picks
    them up (kube-prometheus-stack: ``release: <helm release>``)."""

    @model_validator(mode="after")
    def _reasons(self) -> MetricSources:
        found = Invariants()
        for field in ("eviction_reasons", "disruption_reasons"):
            reasons: list[str] = getattr(self, field)
            for i, reason in enumerate(reasons):
                found.require(
                    _REASON.fullmatch(reason) is not None,
                    f"{field}.{i}",
                    f"{reason!r} is not a Kubernetes reason (letters, digits and '_', "
                    "starting with a letter, e.g. PreemptionByScheduler)",
                )
            found.require(
                len(set(reasons)) == len(reasons),
                field,
                f"{field} lists a reason twice: {reasons}",
            )
        found.raise_if_any()
        return self

    @model_validator(mode="after")
    def _windows(self) -> MetricSources:
        found = Invariants()
        found.require(
            duration_seconds(self.rate_window) >= 2 * duration_seconds(self.evaluation_interval),
            "rate_window",
            f"rate_window ({self.rate_window}) must be at least twice evaluation_interval "
            f"({self.evaluation_interval}); rate() needs two samples in the window",
        )
        found.raise_if_any()
        return self
