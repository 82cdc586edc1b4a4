"""The compaction sidecar: reads the instance's /metrics, decides, drives the plugin.

Edges only: HTTP scrape of vLLM's ``/metrics``, the plugin's control socket, and a small HTTP
server for Prometheus (``GET /metrics``: the sidecar's and the plugin's metrics) and for
shrink requests from the tuner or an alert webhook (``POST /shrink`` with
``{"num_blocks": N}`` and ``Authorization: Bearer <token>``), and for the tuner's compaction
requests (``POST /compaction-requests``, the body of ``compaction_request``, same bearer auth;
the shared compaction token is accepted there too). Decisions are ``triggers.decide``.
Each poll first looks at the policy file (``policy_file.PolicyFile``): a new valid version
is used from that poll's decision on; an invalid one is logged once and the last good policy
stays in use.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policy import PoolPolicy
from runtime.kvcache.control import ControlClient, ControlError, Op, Status
from runtime.kvcache.limits import CompactionLimits
from runtime.kvcache.sidecar.compaction_request import (
    CompactionOrder,
    RequestRejected,
    parse_request,
)
from runtime.kvcache.sidecar.policy_file import PolicyFile
from runtime.kvcache.sidecar.triggers import Decision, InstanceSample, PoolState, decide

USAGE = "vllm:kv_cache_usage_perc"
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
"""Optional: without it the preemption rule has no evidence (``triggers.grow_reason``)."""

log = logging.getLogger(__name__)


def parse_sample(text: str, at_s: float) -> InstanceSample | None:
    """The sample in a ``/metrics`` page (summed over engines); None if the usage or a
    prefix-cache series is missing."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (USAGE, QUERIES, HITS, PREEMPTIONS):
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    if not {USAGE, QUERIES, HITS} <= found.keys():
        return None
    return InstanceSample(at_s, found[USAGE], found[QUERIES], found[HITS], found.get(PREEMPTIONS))


def scrape(url: str, timeout_s: float = 5.0) -> InstanceSample | None:
    """One read of ``url``; None when the instance does not answer (fail closed)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError:
        return None
    return parse_sample(text, time.monotonic())


@dataclass
class CompactionSidecar:
    """State of one sidecar: the policy in use, the last sample, the last compaction, a
    pending shrink request and a pending compaction order. Without ``policy_file`` the policy
    never changes; without ``workload`` compaction requests are refused."""

    policy: PoolPolicy
    metrics_url: str
    client: ControlClient
    policy_file: PolicyFile | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    previous: InstanceSample | None = None
    last_compaction_at_s: float | None = None
    shrink_request: int | None = None
    workload: str | None = None
    compaction_order: CompactionOrder | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.decisions = Counter(
            "gpupool_kv_sidecar_decisions",
            "Sidecar decisions by action and outcome reported by the plugin.",
            ["action", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "gpupool_kv_sidecar_errors",
            "Polls that could not read metrics or reach the plugin.",
            registry=self.registry,
        )
        self.policy_reload_errors = Counter(
            "gpupool_kv_sidecar_policy_reload_errors",
            "New versions of the policy file that failed validation (the last good one stays).",
            registry=self.registry,
        )
        self.policy_generation = Gauge(
            "gpupool_kv_sidecar_policy_generation",
            "Versions of the policy file put in use since the sidecar started (1 = the first).",
            registry=self.registry,
        )
        self.policy_info = Info(
            "gpupool_kv_sidecar_policy",
            "SHA-256 of the policy file version in use.",
            registry=self.registry,
        )
        if self.policy_file is not None:
            self._show_policy_version(self.policy_file)

    def _show_policy_version(self, source: PolicyFile) -> None:
        self.policy_generation.set(source.generation)
        self.policy_info.info({"sha256": source.digest or ""})

    def reload_policy(self) -> None:
        """Put a new valid version of the policy file in use; log and count an invalid one."""
        if self.policy_file is None:
            return
        reload = self.policy_file.refresh()
        if reload.policy is not None:
            self.policy = reload.policy
            self._show_policy_version(self.policy_file)
            log.info(
                "policy %s: version %d loaded (sha256 %s)",
                self.policy_file.path,
                self.policy_file.generation,
                self.policy_file.digest,
            )
        elif reload.outcome == "rejected":
            self.policy_reload_errors.inc()
            log.error(
                "policy %s: new version rejected, keeping version %d:\n%s",
                self.policy_file.path,
                self.policy_file.generation,
                "\n".join(str(problem) for problem in reload.problems),
            )

    def request_shrink(self, num_blocks: int) -> None:
        """Queue a shrink for the next poll (from the tuner or an alert webhook)."""
        with self._lock:
            self.shrink_request = num_blocks

    def request_compaction(self, body: bytes) -> CompactionOrder:
        """Validate the tuner's request and queue it for the next poll (a newer one replaces
        an unexecuted one); raises ``RequestRejected``."""
        if self.workload is None:
            raise RequestRejected(503, "this sidecar was started without --workload")
        order = parse_request(body, self.workload)
        with self._lock:
            self.compaction_order = order
        log.info("compaction request %s queued: %s", order.id, order.reason)
        return order

    def poll(self) -> tuple[Decision, dict[str, Any] | None]:
        """Re-read the policy, read metrics and pool, decide, act; returns the decision and
        the plugin's reply."""
        self.reload_policy()
        policy = self.policy
        current = scrape(self.metrics_url)
        try:
            pool: PoolState | None = PoolState.from_status(self.client.call(Op.STATUS))
        except ControlError:
            pool = None
        except ValueError as exc:  # a reply this sidecar cannot read: decide nothing
            log.error("%s", exc)
            pool = None
        with self._lock:
            request, self.shrink_request = self.shrink_request, None
            order, self.compaction_order = self.compaction_order, None
        decision = decide(
            previous=self.previous,
            current=current,
            pool=pool,
            kv=policy.kv_cache,
            hit_rate_min=policy.alerting.thresholds.kv_hit_rate.min,
            last_compaction_at_s=self.last_compaction_at_s,
            shrink_request=request,
            compaction_request=order is not None,
        )
        if order is not None:
            log.info("compaction request %s: %s (%s)", order.id, decision.action, decision.reason)
        if current is None or pool is None:
            self.errors.inc()
        self.previous = current or self.previous
        reply = self._act(decision, policy)
        status_label = "none" if reply is None else str(reply.get("status"))
        self.decisions.labels(decision.action, status_label).inc()
        if reply is not None and reply.get("status") == Status.DONE and decision.action != "grow":
            self.last_compaction_at_s = current.at_s if current else time.monotonic()
        return decision, reply

    def _act(self, decision: Decision, policy: PoolPolicy) -> dict[str, Any] | None:
        limits = CompactionLimits.from_policy(policy.kv_cache).__dict__
        if decision.action == "none":
            return None
        op = Op(decision.action)
        args: dict[Op, dict[str, Any]] = {
            Op.COMPACT: {"limits": limits},
            Op.SHRINK: {"num_blocks": decision.num_blocks, "limits": limits},
            Op.GROW: {"num_blocks": decision.num_blocks},
        }
        try:
            return self.client.call(op, **args[op])
        except ControlError as exc:
            self.errors.inc()
            return {"status": "error", "reason": str(exc)}

    def exposition(self) -> bytes:
        """The sidecar's metrics followed by the plugin's (read through the socket)."""
        text = generate_latest(self.registry)
        try:
            plugin_text: str = self.client.call(Op.METRICS)["text"]
            return text + plugin_text.encode()
        except ControlError:
            return text


def serve_http(
    sidecar: CompactionSidecar,
    host: str,
    port: int,
    token: str,
    compaction_token: str | None = None,
) -> ThreadingHTTPServer:
    """Start the sidecar's HTTP server in a daemon thread (``GET /metrics``, ``POST /shrink``,
    ``POST /compaction-requests``); ``compaction_token`` is also accepted on the last."""
    server = _SidecarServer((host, port), sidecar, token, compaction_token)
    threading.Thread(target=server.serve_forever, name="gpupool-kv-http", daemon=True).start()
    return server


class _SidecarServer(ThreadingHTTPServer):
    """The HTTP server of one sidecar, holding what its handler answers with."""

    def __init__(
        self,
        address: tuple[str, int],
        sidecar: CompactionSidecar,
        token: str,
        compaction_token: str | None,
    ) -> None:
        self.sidecar = sidecar
        self.token = token
        self.compaction_token = compaction_token
        super().__init__(address, _SidecarHandler)


class _SidecarHandler(BaseHTTPRequestHandler):
    """One request: metrics for Prometheus, shrink and compaction requests (bearer auth)."""

    server: _SidecarServer

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self._reply(404, b"not found\n")
            return
        self._reply(200, self.server.sidecar.exposition(), "text/plain; version=0.0.4")

    def do_POST(self) -> None:
        if self.path not in ("/shrink", "/compaction-requests"):
            self._reply(404, b"not found\n")
        elif not self._authorized():
            self._reply(401, b"unauthorized\n")
        elif self.path == "/compaction-requests":
            self._compaction_request()
        else:
            self._shrink_request()

    def _authorized(self) -> bool:
        """The bearer token is the sidecar's, or on compaction requests the shared one."""
        supplied = self.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        accepted = [self.server.token]
        if self.path == "/compaction-requests" and self.server.compaction_token:
            accepted.append(self.server.compaction_token)
        return any(hmac.compare_digest(supplied, t.encode()) for t in accepted)

    def _shrink_request(self) -> None:
        try:
            num_blocks = int(json.loads(self._body())["num_blocks"])
        except (ValueError, KeyError, TypeError):
            self._reply(400, b'expected JSON {"num_blocks": N}\n')
            return
        self.server.sidecar.request_shrink(num_blocks)
        self._reply(202, b"queued\n")

    def _compaction_request(self) -> None:
        try:
            order = self.server.sidecar.request_compaction(self._body())
        except RequestRejected as exc:
            self._reply(exc.status, f"{exc}\n".encode())
            return
        self._reply(202, f"queued {order.id}\n".encode())

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _reply(self, code: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return
