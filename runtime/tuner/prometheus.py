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

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

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
