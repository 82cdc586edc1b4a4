"""The tuner's compaction request at the sidecar: real HTTP in, a real control socket out.

The sidecar's HTTP server (``serve_http``) runs on 127.0.0.1; the plugin's side of the control
socket is a real ``ControlServer`` answering for an unchanging pool (as in
test_policy_reload.py); the instance's ``/metrics`` page is a file read through ``file://``.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy import DEFAULT_POLICY, load_policy
from runtime.kvcache.control import ControlClient, ControlServer
from runtime.kvcache.sidecar.compaction_request import KIND, VERSION, RequestRejected, parse_request
from runtime.kvcache.sidecar.service import CompactionSidecar, serve_http
from runtime.kvcache.sidecar.triggers import InstanceSample, PoolState, decide, shrink_target
from runtime.tuner.compaction import compaction_payload
from runtime.tuner.proposals import CompactionRequest, Evidence

POLICY = load_policy(DEFAULT_POLICY)
WORKLOAD = POLICY.workloads[0].name
POOL = {
    "usable_blocks": 1000, "original_blocks": 1000, "occupied_blocks": 120, "held_blocks": 120,
    "max_model_len": 512, "block_size": 32, "blocks_short": 0,
}  # fmt: skip
USAGE_ABOVE = POLICY.kv_cache.compaction_usage_below + 0.05
"""KV usage the instance reports: above the threshold, so only a request can compact."""
METRICS = (
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0"}} {USAGE_ABOVE}\n'
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{engine="0"} 640.0\n'
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{engine="0"} 600.0\n'
)


def tuner_body(workloads: list[str] | None = None) -> dict[str, Any]:
    """The body the tuner sends for the shipped policy (optionally other workloads)."""
    request = CompactionRequest(
        "hit rate low, usage low", (Evidence("gpupool:kv_cache_usage:ratio", "< 0.4", "0.2"),)
    )
    body = compaction_payload(request, policy=POLICY, at=1_700_000_000.0)
    if workloads is not None:
        body["workloads"] = workloads
    return body


class Sidecar:
    """A worker with its HTTP server and a recording control socket."""

    def __init__(self, tmp: Path, workload: str | None, shared: str | None) -> None:
        self.token = secrets.token_hex(8)
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.control = ControlServer(tmp / "ctl" / "kv.sock", self.token, self._handle)
        metrics = tmp / "metrics.txt"
        metrics.write_text(METRICS)
        client = ControlClient(self.control.path, self.token)
        self.worker = CompactionSidecar(POLICY, metrics.as_uri(), client, workload=workload)
        self.http = serve_http(self.worker, "127.0.0.1", 0, self.token, shared)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def _handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self.asked.append((op, args))
        if op == "status":
            return dict(POOL)
        return {"status": "done", "usable_blocks": args.get("num_blocks", POOL["usable_blocks"])}

    def post(self, path: str, body: bytes, token: str | None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        self.http.shutdown()
        self.control.close()


SHARED = secrets.token_hex(8)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    running = Sidecar(tmp_path, WORKLOAD, SHARED)
    yield running
    running.close()


def test_accepted_request_compacts_on_the_next_poll(sidecar: Sidecar) -> None:
    body = tuner_body()
    code, text = sidecar.post("/compaction-requests", json.dumps(body).encode(), sidecar.token)
    assert (code, text.strip()) == (202, f"queued {body['id']}")
    assert sidecar.asked == []  # queued, not executed by the HTTP thread

    decision, reply = sidecar.worker.poll()
    target = shrink_target(POOL["occupied_blocks"], POLICY.kv_cache.shrink_target_usage)
    assert (decision.action, decision.num_blocks) == ("shrink", target)
    assert decision.reason == "compaction requested by the tuner"
    assert [op for op, _ in sidecar.asked] == ["status", "shrink"]
    assert sidecar.asked[1][1]["num_blocks"] == target
    assert reply == {"status": "done", "usable_blocks": target}

    # executed once: the next poll sees usage above the threshold and does nothing
    again, _ = sidecar.worker.poll()
    assert again.action == "none" and ">=" in again.reason, again


def test_shared_compaction_token_is_accepted_only_for_compaction_requests(
    sidecar: Sidecar,
) -> None:
    body = json.dumps(tuner_body()).encode()
    assert sidecar.post("/compaction-requests", body, SHARED)[0] == 202
    assert sidecar.post("/shrink", b'{"num_blocks": 10}', SHARED)[0] == 401


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (json.dumps(tuner_body(["another-flex"])).encode(), 422, "not 'llama-8b-flex'"),
        (b"{not json", 400, "body is not JSON"),
        (b"[1, 2]", 400, "expected a JSON object, found list"),
        (json.dumps({**tuner_body(), "kind": "other"}).encode(), 400, f"expected {KIND!r}"),
        (json.dumps({**tuner_body(), "version": 2}).encode(), 400, f"expected {VERSION}, found 2"),
        (json.dumps({**tuner_body(), "workloads": "x"}).encode(), 400, "expected list, found str"),
        (
            json.dumps({k: v for k, v in tuner_body().items() if k != "id"}).encode(),
            400,
            "field 'id' is missing",
        ),
    ],
)
def test_invalid_or_foreign_requests_are_refused_and_not_queued(
    sidecar: Sidecar, body: bytes, code: int, says: str
) -> None:
    found, text = sidecar.post("/compaction-requests", body, sidecar.token)
    assert found == code and says in text, (found, text)
    assert sidecar.worker.compaction_order is None
    decision, _ = sidecar.worker.poll()
    assert decision.action == "none", decision


@pytest.mark.parametrize("token", [None, "wrong"])
def test_request_without_the_token_is_refused(sidecar: Sidecar, token: str | None) -> None:
    code, _ = sidecar.post("/compaction-requests", json.dumps(tuner_body()).encode(), token)
    assert code == 401
    assert sidecar.worker.compaction_order is None


def test_sidecar_without_a_workload_refuses_requests(tmp_path: Path) -> None:
    bare = Sidecar(tmp_path, None, None)
    try:
        code, text = bare.post(
            "/compaction-requests", json.dumps(tuner_body()).encode(), bare.token
        )
    finally:
        bare.close()
    assert code == 503 and "--workload" in text


def test_parse_request_accepts_exactly_what_the_tuner_sends() -> None:
    body = tuner_body()
    order = parse_request(json.dumps(body).encode(), WORKLOAD)
    assert (order.id, order.reason) == (body["id"], body["reason"])
    with pytest.raises(RequestRejected, match="field 'version': expected int, found bool"):
        parse_request(json.dumps({**body, "version": True}).encode(), WORKLOAD)


SAMPLE = InstanceSample(at_s=1000.0, usage=USAGE_ABOVE, prefix_queries=0, prefix_hits=0)


def test_requested_compaction_still_waits_for_the_min_interval() -> None:
    pool = PoolState(**POOL)
    args: dict[str, Any] = {
        "previous": None,
        "current": SAMPLE,
        "pool": pool,
        "kv": POLICY.kv_cache,
        "hit_rate_min": POLICY.alerting.thresholds.kv_hit_rate.min,
    }
    recent = decide(**args, last_compaction_at_s=SAMPLE.at_s - 1, compaction_request=True)
    assert recent.action == "none" and "less than" in recent.reason
    unrequested = decide(**args, last_compaction_at_s=None)
    assert unrequested.action == "none" and ">=" in unrequested.reason
    requested = decide(**args, last_compaction_at_s=None, compaction_request=True)
    assert requested.action == "shrink"


def test_grow_on_a_low_hit_rate_wins_over_a_requested_compaction() -> None:
    shrunk = PoolState(**{**POOL, "usable_blocks": 500})
    before = InstanceSample(at_s=900.0, usage=0.1, prefix_queries=0, prefix_hits=0)
    after = InstanceSample(at_s=1000.0, usage=0.1, prefix_queries=100, prefix_hits=0)
    decision = decide(
        previous=before,
        current=after,
        pool=shrunk,
        kv=POLICY.kv_cache,
        hit_rate_min=POLICY.alerting.thresholds.kv_hit_rate.min,
        last_compaction_at_s=None,
        compaction_request=True,
    )
    assert (decision.action, decision.num_blocks) == ("grow", 1000)
