"""The real vLLM engine (CPU build) started by the session fixture with OUR arguments.

Proves: the engine starts with what runtime.vllm generates for the tiny model, it allocates
the number of KV blocks we predict (within one), it serves, and ``vllm:cache_config_info``
shows the values we set.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from runtime.vllm import KvCachePlan
from tests.harness.servers import Server
from tests.harness.tiny_engine import tiny_plan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plan(vllm_server: Server) -> KvCachePlan:
    return tiny_plan(int(vllm_server.url.rsplit(":", 1)[1]))


def _cache_config_info(server: Server) -> dict[str, str]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, Any] = json.load(response)
        return result


def test_engine_allocates_the_predicted_blocks(vllm_server: Server, plan: KvCachePlan) -> None:
    info = _cache_config_info(vllm_server)
    assert abs(int(info["num_gpu_blocks"]) - plan.num_blocks) <= 1
    # the engine's own log line: "CPU KV cache size: 196,608 tokens"
    logged = re.search(r"KV cache size: ([\d,]+) tokens", vllm_server.log_tail(10**7))
    assert logged is not None, vllm_server.log_tail()
    tokens = int(logged.group(1).replace(",", ""))
    assert abs(tokens - plan.max_concurrent_tokens) <= plan.block_size


def test_cache_config_info_shows_the_values_we_set(vllm_server: Server, plan: KvCachePlan) -> None:
    info = _cache_config_info(vllm_server)
    assert info["block_size"] == str(plan.block_size)
    assert info["user_specified_block_size"] == "True"
    assert info["kv_cache_memory_bytes"] == str(plan.kv_cache_bytes)
    assert info["enable_prefix_caching"] == str(plan.prefix_caching)
    assert info["cache_dtype"] == plan.kv_dtype_flag
    # --kv-cache-memory-bytes was honoured, not the legacy VLLM_CPU_KVCACHE_SPACE
    assert "Explicitly set" in vllm_server.log_tail(10**7)


def test_engine_serves_token_id_prompts(vllm_server: Server, plan: KvCachePlan) -> None:
    result = _post(
        vllm_server,
        "/v1/completions",
        {
            "model": plan.model_path,
            "prompt": list(range(1, 40)),
            "max_tokens": 6,
            "return_token_ids": True,
        },
    )
    choice = result["choices"][0]
    assert len(choice["token_ids"]) == 6
    assert result["usage"] == result["usage"] | {"prompt_tokens": 39, "completion_tokens": 6}
