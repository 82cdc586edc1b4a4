"""A local exporter serving DCGM-, kube-state-metrics- and vLLM-shaped series for a script.

It uses its own ``CollectorRegistry`` (never the global one). Counters are integrated from
scripted rates at every scrape, so switching the scenario keeps them monotonic like the real
exporters' counters. It always answers in the text format, as vLLM's ``/metrics`` does: under
prometheus_client's own content negotiation, Prometheus 2.x would get OpenMetrics with the
``vllm:`` colons escaped to ``vllm_``, which real vLLM never serves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

FLEX_NS = "gpupool-flex"
QUERIED_TOKENS_PER_S = 100.0


@dataclass
class Scenario:
    """What the cluster looks like right now; tests change it while Prometheus scrapes."""

    evictions_per_s: float = 0.0
    """Flex pods whose ``Evicted`` reason turns on, per second."""
    hit_ratio: float = 0.95
    """Prefix-cache hits per queried token on instance ``flex-a`` (``flex-idle`` gets none)."""


@dataclass
class _State:
    hits: float = 0.0
    queries: float = 0.0
    pods_on: list[str] = field(default_factory=list)
    next_pod: int = 0
    eviction_debt: float = 0.0


class ScenarioCollector(Collector):
    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic) -> None:
        self.scenario, self.clock = scenario, clock
        self.state, self.last = _State(), clock()
        self.lock = threading.Lock()

    def _advance(self) -> None:
        now = self.clock()
        dt, self.last = now - self.last, now
        s, st = self.scenario, self.state
        st.queries += QUERIED_TOKENS_PER_S * dt
        st.hits += QUERIED_TOKENS_PER_S * s.hit_ratio * dt
        st.eviction_debt += s.evictions_per_s * dt
        while st.eviction_debt >= 1:
            # The pod next in line was already exported with reason 0; now its reason turns on.
            st.pods_on.append(f"llm-{st.next_pod}")
            st.next_pod += 1
            st.eviction_debt -= 1

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            self._advance()
            st = self.state
            util = GaugeMetricFamily(
                "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)", labels=["gpu", "Hostname"]
            )
            used = GaugeMetricFamily(
                "DCGM_FI_DEV_FB_USED", "FB used (MiB)", labels=["gpu", "Hostname"]
            )
            free = GaugeMetricFamily(
                "DCGM_FI_DEV_FB_FREE", "FB free (MiB)", labels=["gpu", "Hostname"]
            )
            for node in ("n-prod", "n-flex"):
                for gpu in ("0", "1"):
                    util.add_metric([gpu, node], 50.0)
                    used.add_metric([gpu, node], 40_000.0)
                    free.add_metric([gpu, node], 100_000.0)
            yield from (util, used, free)
            nodes = GaugeMetricFamily(
                "kube_node_labels", "node labels", labels=["node", "label_gpupool_io_pool"]
            )
            nodes.add_metric(["n-prod", "gpu-prod"], 1)
            nodes.add_metric(["n-flex", "gpu-flex"], 1)
            yield nodes
            phase = GaugeMetricFamily(
                "kube_pod_status_phase", "pod phase", labels=["namespace", "pod", "phase"]
            )
            reason = GaugeMetricFamily(
                "kube_pod_status_reason", "pod status reason", labels=["namespace", "pod", "reason"]
            )
            for i in range(st.next_pod + 1):
                pod = f"llm-{i}"
                evicted = pod in st.pods_on
                phase.add_metric([FLEX_NS, pod, "Running"], 0 if evicted else 1)
                phase.add_metric([FLEX_NS, pod, "Failed"], 1 if evicted else 0)
                reason.add_metric([FLEX_NS, pod, "Evicted"], 1 if evicted else 0)
            yield from (phase, reason)
            hits = CounterMetricFamily(
                "vllm:prefix_cache_hits",
                "prefix cache hits (tokens)",
                labels=["namespace", "workload", "pod", "engine"],
            )
            queries = CounterMetricFamily(
                "vllm:prefix_cache_queries",
                "queried tokens",
                labels=["namespace", "workload", "pod", "engine"],
            )
            usage = GaugeMetricFamily(
                "vllm:kv_cache_usage_perc",
                "KV usage (0-1)",
                labels=["namespace", "workload", "pod", "engine"],
            )
            hits.add_metric([FLEX_NS, "llm", "flex-a", "0"], st.hits)
            queries.add_metric([FLEX_NS, "llm", "flex-a", "0"], st.queries)
            hits.add_metric([FLEX_NS, "llm", "flex-idle", "0"], 0.0)
            queries.add_metric([FLEX_NS, "llm", "flex-idle", "0"], 0.0)
            usage.add_metric([FLEX_NS, "llm", "flex-a", "0"], 0.4)
            usage.add_metric([FLEX_NS, "llm", "flex-idle", "0"], 0.0)
            yield from (hits, queries, usage)


@dataclass
class Exporter:
    url: str
    scenario: Scenario
    stop: Callable[[], None]


def serve(scenario: Scenario, port: int) -> Exporter:
    """Serve ``scenario`` on 127.0.0.1:``port`` until ``stop()``."""
    registry = CollectorRegistry()
    registry.register(ScenarioCollector(scenario))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return Exporter(f"127.0.0.1:{port}", scenario, stop)
