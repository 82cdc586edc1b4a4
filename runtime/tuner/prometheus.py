"""Edge: read the tuner's series from Prometheus into a ``MetricsSnapshot``.

One query per series, a range selector evaluated at the cycle's time (``name[30m]`` with
``time=``): Prometheus returns the raw samples with their own timestamps, so staleness is
judged on the real newest sample, not on a lookback-filled evaluation step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from policy.pool import PoolPolicy
from runtime.metrics import catalogue
from runtime.tuner.selfmetrics import TunerMetrics
from runtime.tuner.signals import Combine, snapshot_of
from runtime.tuner.snapshot import MetricsSnapshot, Series

log = logging.getLogger(__name__)


def connect(url: str, *, timeout_s: float = 10.0) -> PrometheusConnect:
    """A client that gives up fast: an unreachable Prometheus fails the cycle closed."""
    return PrometheusConnect(
        url=url, retry=Retry(total=1, backoff_factor=0.2), timeout=int(timeout_s)
    )


def fetch_snapshot(
    client: PrometheusConnect,
    *,
    signals: Mapping[str, Combine],
    at: float,
    window: str,
    metrics: TunerMetrics,
) -> MetricsSnapshot:
    """Each signal's samples over ``window`` ending at ``at``, every label set kept (and
    combined per ``signals``); unreachable stops the read."""
    read: dict[str, list[Series]] = {}
    for name in signals:
        started = time.perf_counter()
        try:
            result = client.custom_query(f"{name}[{window}]", params={"time": f"{at:.3f}"})
        except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
            log.warning("Prometheus query for %s failed: %s", name, exc)
            return snapshot_of(at, read, unreachable=f"{type(exc).__name__}: {exc}", how=signals)
        finally:
            metrics.query_seconds.observe(time.perf_counter() - started)
        read[name] = [
            Series(
                tuple(sorted((k, v) for k, v in item.get("metric", {}).items() if k != "__name__")),
                tuple((float(t), _value(v)) for t, v in item.get("values", [])),
            )
            for item in result
        ]
    return snapshot_of(at, read, how=signals)


def _value(text: str) -> float:
    value = float(text)
    return math.nan if math.isinf(value) else value


class TraceQueryError(RuntimeError):
    """Prometheus could not answer a production-trace range query; one line."""


POINTS_PER_QUERY = 10_000
"""Steps one range query asks for: Prometheus refuses more than 11,000 points a series."""


def production_samples(
    client: PrometheusConnect, policy: PoolPolicy, *, start: float, end: float, step_s: float
) -> list[tuple[float, float, float | None]]:
    """``(time, GPUs production demanded, its busy GPU-equivalents or None)`` every
    ``step_s`` from ``start`` to ``end``, from the catalogue's standalone PromQL: it reads
    kube-state-metrics and dcgm-exporter directly, so the history from before gpupool's
    recording rules were installed counts too. A long window is read in pieces of
    ``POINTS_PER_QUERY`` steps; steps without a demand sample are left out."""
    queries = catalogue.build_catalogue(policy)
    names = (catalogue.PRODUCTION_GPUS_DEMANDED, catalogue.PRODUCTION_BUSY_GPUS)
    read: dict[str, dict[float, float]] = {name: {} for name in names}
    piece_start = start
    while piece_start <= end:
        piece_end = min(end, piece_start + (POINTS_PER_QUERY - 1) * step_s)
        for name in names:
            try:
                result = client.custom_query_range(
                    queries.query(name),
                    start_time=datetime.fromtimestamp(piece_start, UTC),
                    end_time=datetime.fromtimestamp(piece_end, UTC),
                    step=f"{step_s:g}",
                )
            except (requests.RequestException, PrometheusApiClientException, ValueError) as exc:
                raise TraceQueryError(f"{name}: {type(exc).__name__}: {exc}") from None
            values = result[0]["values"] if result else []
            read[name] |= {float(t): _value(v) for t, v in values}
        piece_start = piece_end + step_s
    demanded, busy = (read[name] for name in names)
    return [(t, demanded[t], busy.get(t)) for t in sorted(demanded)]
