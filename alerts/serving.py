"""Serving-layer alerts: shed batch traffic, pickers routing blind, requests to draining pods.

Every rule reads series that exist only where gpupool's endpoint pickers run (the
``inference-extension`` serving mode): the pickers' own, which carry ``inference_pool``, or
flex-pod series joined with a picker's scrape target in the namespace. So nothing can fire on
a cluster without the serving layer, and the rules do not depend on the policy's ``serving``
section (a stack with ``gpupool:serving: off`` renders the same rule file with or without it):

- ServingRequestsShed (per pool): the endpoint picker refuses a large share of the pool's
  requests as saturated. Both distributions count a refused request in their error counter
  with ``error_code="ResourceExhausted"`` (answered HTTP 429) and count admitted requests in
  the request counter (GIE ``pkg/epp/handlers/server.go``: ``RecordRequestCounter`` runs only
  once the request body was handled without error), so the share is refused / (refused +
  admitted).
- ServingEndpointMetricsStale (label ``signal``): ``picker-polls``, the picker's polls of the
  members' ``/metrics`` fail (llm-d-router's data-layer counter; GIE v1.5 exports none); or
  ``scrape``, a Ready flex pod's ``/metrics``, the endpoint the picker polls every 50 ms, does
  not answer Prometheus either. The picker then treats the pod as saturated (stale metrics,
  ``metricsStalenessThreshold``) or routes on old numbers.
- ServingRequestsToTerminatingPod (per pod): a flex pod being deleted answered requests with
  vLLM's shutdown refusal (an empty 200, finish reason ``abort``, counted in
  ``vllm:request_success_total{finished_reason="abort"}``; tests/serving/
  test_eviction_sequence.py sees both on the real server): something still routes to it after
  SIGTERM, which the readiness-first shutdown exists to prevent. A scrape must catch the
  counter before the process exits, so a single burst in a drain of a few seconds can be
  missed; misrouting on every eviction is not.

The pickers' series carry ``inference_pool`` (``infra.builders.scraping.POOL_TARGET_LABEL``),
set by the PodMonitor gpupool renders per pool; the metric names are the pickers' own, newest
first, joined with ``or`` so a picker that exports a deprecated alias too is counted once:

- llm-d-router ``pkg/epp/metrics/llm_d_router_metrics.go`` (subsystem ``llm_d_router_epp``),
  its earlier ``llm_d_epp`` prefix (named by the deprecation notices of its ``metrics.go``);
- GIE ``pkg/epp/metrics/metrics.go`` (subsystem ``inference_objective``), which llm-d-router
  still exports as deprecated aliases;
- the data-layer poll errors: llm-d-router ``llm_d_router_epp``/``llm_d_epp`` and the
  ``llm_d_inference_scheduler`` prefix of llm-d-inference-scheduler.

kube-state-metrics gives ``kube_pod_status_ready`` and ``kube_pod_deletion_timestamp``.
"""

from __future__ import annotations

from collections.abc import Sequence

from alerts.rules import Group, Rule, alert, group
from infra.builders.scraping import POOL_TARGET_LABEL
from policy.base import duration_seconds, format_duration
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue, num

REQUESTS = (
    "llm_d_router_epp_request_total",
    "llm_d_epp_request_total",
    "inference_objective_request_total",
)
"""The pickers' admitted-request counters, newest name first."""

ERRORS = (
    "llm_d_router_epp_request_error_total",
    "llm_d_epp_request_error_total",
    "inference_objective_request_error_total",
)
"""The pickers' error counters (label ``error_code``), newest name first."""

POLL_ERRORS = (
    "llm_d_router_epp_datalayer_poll_errors_total",
    "llm_d_epp_datalayer_poll_errors_total",
    "llm_d_inference_scheduler_datalayer_poll_errors_total",
)
"""llm-d's counter of failed polls of the members' metrics (label ``source_type``)."""

SHED_CODE = "ResourceExhausted"
"""``error_code`` of a request refused at saturation; both pickers answer it with HTTP 429
(GIE and llm-d-router ``BuildErrResponse``)."""

VLLM_CONTAINER = "vllm"
"""Name of the vLLM container in a flex pod (``infra.builders.vllm_container``): the scrape target
of its ``http`` port carries it as ``container``."""

SHED_RATE = "gpupool:serving_shed_requests:rate"
"""Requests per second a pool's picker refused as saturated (per ``namespace``,
``inference_pool``), over ``metrics.rate_window``."""

ADMITTED_RATE = "gpupool:serving_admitted_requests:rate"
"""Requests per second a pool's picker admitted, same labels and window."""

ABORTED = 'finished_reason="abort"'
"""vLLM's finish reason of the requests it refuses after SIGTERM (and of client aborts)."""


def first_of(names: Sequence[str], matchers: str, by: str, window: str) -> str:
    """``sum by (by) (rate(name{matchers}[window]))`` of the first name that has series for a
    label set: ``or`` keeps the left side, so aliases of one counter are not added up."""
    return (
        "(" + " or ".join(f"sum by ({by}) (rate({n}{{{matchers}}}[{window}]))" for n in names) + ")"
    )


def _by_pool() -> str:
    """The labels a picker's series are summed by: one series per pool."""
    return f"namespace, {POOL_TARGET_LABEL}"


def _picker() -> str:
    """Matcher of the series a picker of gpupool's exports (its pool label set)."""
    return f'{POOL_TARGET_LABEL}!=""'


def _flex_namespace(policy: PoolPolicy) -> str:
    """Matcher of the flex namespace."""
    return f'namespace="{policy.cluster.flex_namespace}"'


def _picker_runs(policy: PoolPolicy) -> str:
    """A picker of gpupool's runs in the flex namespace (its scrape target, up or not)."""
    return f"group by (namespace) (up{{{_flex_namespace(policy)}, {_picker()}}})"


def _request_rates(policy: PoolPolicy) -> list[Rule]:
    """The picker's refused and admitted request rates, per pool."""
    window = policy.metrics.rate_window
    by, picker = _by_pool(), _picker()
    return [
        {
            "record": SHED_RATE,
            "expr": first_of(ERRORS, f'{picker}, error_code="{SHED_CODE}"', by, window),
        },
        {"record": ADMITTED_RATE, "expr": first_of(REQUESTS, picker, by, window)},
    ]


def _requests_shed(policy: PoolPolicy) -> Rule:
    """ServingRequestsShed: a pool's picker refuses a large share of its requests."""
    window = policy.metrics.rate_window
    shed = policy.alerting.thresholds.serving_shed
    # a pool whose every request was refused has no admitted series: count it as 0
    total = f"({SHED_RATE} + ({ADMITTED_RATE} or {SHED_RATE} * 0))"
    return alert(
        "ServingRequestsShed",
        f"{SHED_RATE} / {total} > {num(shed.max_share)}"
        f" and {total} * 60 >= {num(shed.min_requests_per_minute)}",
        shed,
        summary="An inference pool refuses a large share of its requests as saturated.",
        description=(
            f"The endpoint picker of pool {{{{ $labels.{POOL_TARGET_LABEL} }}}} "
            "(namespace {{ $labels.namespace }}) refused {{ $value | humanizePercentage }} "
            f"of its requests over {window} with HTTP 429 (every member over "
            "serving.endpoint_picker.queue_depth_max or kv_cache.page_table_max_usage, "
            f"or its metrics stale); limit {shed.max_share:.0%} for {shed.for_}, at "
            f"{shed.min_requests_per_minute:g} requests per minute or more. Sheddable "
            "traffic is refused by design while production needs the GPUs; sustained, "
            "the flex pool is too small for it."
        ),
    )


def _picker_polls_stale(policy: PoolPolicy) -> Rule:
    """ServingEndpointMetricsStale, signal ``picker-polls``: the picker's polls fail."""
    window = policy.metrics.rate_window
    stale = policy.alerting.thresholds.serving_metrics_stale
    polls = first_of(POLL_ERRORS, _picker(), _by_pool(), window)
    return _signal(
        "picker-polls",
        alert(
            "ServingEndpointMetricsStale",
            f"{polls} * 60 > 0",
            stale,
            summary="An endpoint picker cannot read its pool members' metrics.",
            description=(
                f"The endpoint picker of pool {{{{ $labels.{POOL_TARGET_LABEL} }}}} "
                "(namespace {{ $labels.namespace }}) failed {{ $value | humanize }} polls "
                f"per minute of its members' /metrics over {window}, for {stale.for_}: it "
                "routes on stale queue and KV numbers, and counts the members it cannot "
                "read as saturated (sheddable requests refused)."
            ),
        ),
    )


def _scrape_stale(policy: PoolPolicy) -> Rule:
    """ServingEndpointMetricsStale, signal ``scrape``: a Ready pod's /metrics is down."""
    stale = policy.alerting.thresholds.serving_metrics_stale
    ns = _flex_namespace(policy)
    return _signal(
        "scrape",
        alert(
            "ServingEndpointMetricsStale",
            f'(up{{{ns}, container="{VLLM_CONTAINER}"}} == 0)'
            f' and on (namespace, pod) (kube_pod_status_ready{{{ns}, condition="true"}} == 1)'
            f" and on (namespace) {_picker_runs(policy)}",
            stale,
            summary="A Ready flex pod's metrics do not answer while a picker routes to it.",
            description=(
                "Prometheus cannot scrape /metrics of {{ $labels.pod }} (workload "
                f"{{{{ $labels.{policy.metrics.workload_label} }}}}, namespace "
                "{{ $labels.namespace }}) "
                f"for {stale.for_} although the pod is Ready, in a namespace where an "
                "endpoint picker polls the same endpoint: the picker treats it as "
                "saturated or routes on old numbers."
            ),
        ),
    )


def _requests_to_terminating_pod(policy: PoolPolicy) -> Rule:
    """ServingRequestsToTerminatingPod: a pod being deleted still answers requests."""
    term = policy.alerting.thresholds.serving_terminating_requests
    step = policy.metrics.evaluation_interval
    ns = _flex_namespace(policy)
    # two scrape intervals (gpupool's PodMonitors scrape at evaluation_interval): the shortest
    # window increase() can read, so aborts from before the deletion barely count
    short = format_duration(2 * duration_seconds(step))
    aborts = (
        f"sum by (namespace, pod) (increase(vllm:request_success_total{{{ns}, {ABORTED}}}"
        f"[{short}])) and on (namespace, pod) "
        f"max_over_time(kube_pod_deletion_timestamp{{{ns}}}[{short}])"
    )
    return alert(
        "ServingRequestsToTerminatingPod",
        f"max_over_time(({aborts})[{term.window}:{step}]) > 0"
        f" and on (namespace) {_picker_runs(policy)}",
        term,
        summary="Requests reach a flex pod after it stopped taking them.",
        description=(
            "{{ $labels.pod }} (namespace {{ $labels.namespace }}) answered up to "
            "{{ $value | humanize }} requests within "
            f"{short} with vLLM's shutdown refusal (an empty 200, finish reason abort) "
            f"while it was being deleted, in the last {term.window}: routing still sent "
            "it requests after its readiness failed and vLLM got SIGTERM. Check the "
            "readiness probe and disruption.prestop_delay_s against how fast the Gateway "
            "and the endpoint picker drop a pod."
        ),
    )


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    """The serving group: request rates, then shed, stale and misrouting alerts."""
    rules = [
        *_request_rates(policy),
        _requests_shed(policy),
        _picker_polls_stale(policy),
        _scrape_stale(policy),
        _requests_to_terminating_pod(policy),
    ]
    return [group("gpupool.serving", policy, rules)]


def _signal(name: str, rule: Rule) -> Rule:
    """``rule`` with its ``signal`` label: which of the two stale signals fired."""
    rule["labels"]["signal"] = name
    return rule
