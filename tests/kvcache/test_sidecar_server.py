"""The sidecar against a real vLLM OpenAI server with the plugin active (multiprocess engine).

This is the deployment shape: API server, EngineCore and worker in separate processes; the
plugin's socket lives in the EngineCore process and reaches the worker through
``collective_rpc`` by method name.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY, load_policy
from runtime.cli.app import app
from runtime.kvcache.control import ControlClient
from runtime.kvcache.limits import CompactionLimits
from runtime.kvcache.sidecar.service import CompactionSidecar, scrape, serve_http
from tests.harness.servers import TINY_MODEL, Server, free_port, start_vllm_server
from tests.kvcache.engine import shared_prefix_prompts

pytestmark = pytest.mark.slow

POOL_BLOCKS = 2048


@dataclass
class Served:
    server: Server
    socket: Path
    token_file: Path

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def complete(self, prompts: list[list[int]]) -> list[list[int]]:
        """Greedy completions of all prompts at once (they share the engine's batches)."""

        def one(prompt: list[int]) -> list[int]:
            body = {
                "model": str(TINY_MODEL),
                "prompt": prompt,
                "max_tokens": 16,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            request = urllib.request.Request(
                self.server.url + "/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                tokens: list[int] = json.load(response)["choices"][0]["token_ids"]
                return tokens

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, prompts))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    plugins = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    if "runtime.kvcache.in_vllm.plugin:register" not in plugins:
        pytest.fail(
            "the gpupool vLLM plugin is not registered in this environment: run "
            "`pip install --no-deps -e .` so the entry point in pyproject.toml is installed"
        )
    workdir = tmp_path_factory.mktemp("kvsrv")
    token_file = workdir / "token"
    token_file.write_text(secrets.token_hex(16))
    socket = workdir / "kv.sock"
    args = [
        "--model", str(TINY_MODEL), "--load-format", "dummy", "--skip-tokenizer-init",
        "--block-size", "32", "--max-model-len", "512", "--max-num-seqs", "16",
        "--enforce-eager", "--num-gpu-blocks-override", str(POOL_BLOCKS),
    ]  # fmt: skip
    env = {
        "GPUPOOL_KV_COMPACTION": "1",
        "GPUPOOL_KV_SOCKET": str(socket),
        "GPUPOOL_KV_TOKEN_FILE": str(token_file),
    }
    server = start_vllm_server(args, workdir, env=env)
    yield Served(server, socket, token_file)
    server.stop()


def test_sidecar_shrinks_grows_and_prefix_hits_keep_counting(served: Served) -> None:
    policy = load_policy(DEFAULT_POLICY)
    worker = CompactionSidecar(
        policy, served.server.url + "/metrics", ControlClient(served.socket, served.token)
    )
    prompts = shared_prefix_prompts(12, seed=3)
    first = served.complete(prompts)

    # the freed partial blocks of those requests leave holes below the cached prefixes
    limits = CompactionLimits.from_policy(policy.kv_cache).__dict__
    packed = worker.client.call("compact", limits=limits)
    assert packed["status"] == "done" and packed["blocks_moved"] > 0, packed
    assert packed["fragmentation"] == 0.0

    decision, reply = worker.poll()  # usage is tiny: shrink (to where nothing has to move)
    assert decision.action == "shrink" and reply is not None, (decision, reply)
    assert reply["status"] == "done", reply
    assert decision.num_blocks is not None and decision.num_blocks < POOL_BLOCKS
    assert reply["usable_blocks"] == decision.num_blocks
    assert reply["released_bytes"] > 0 and reply["released_measured_bytes"] > 0
    status = worker.client.call("status")
    assert status["highest_occupied"] < status["usable_blocks"] == decision.num_blocks

    before = scrape(served.server.url + "/metrics")
    # four at a time: all twelve at once do not fit the pool sized for the idle cache, and
    # their preemptions would grow it back (triggers.grow_reason) before the hit-rate rule
    again = [
        tokens for i in range(0, len(prompts), 4) for tokens in served.complete(prompts[i : i + 4])
    ]
    after = scrape(served.server.url + "/metrics")
    assert again == first
    assert before is not None and after is not None
    assert before.preemptions is not None and after.preemptions == before.preemptions
    assert after.prefix_hits - before.prefix_hits >= len(prompts) * 96  # moved prefixes hit

    settled, _ = worker.poll()  # high hit rate, usage near the shrink target: nothing to do
    assert settled.action == "none", settled
    served.complete([[7 + i] * 100 for i in range(6)])  # nothing cached: hit rate falls
    grow, grown = worker.poll()
    assert grow.action == "grow", grow
    assert grown is not None and grown["usable_blocks"] == POOL_BLOCKS

    port = free_port()
    http = serve_http(worker, "127.0.0.1", port, served.token)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            text = page.read().decode()
        assert 'gpupool_kv_resizes_total{direction="shrink"} 1.0' in text
        assert 'gpupool_kv_resizes_total{direction="grow"} 1.0' in text
        assert "gpupool_kv_pause_seconds_count 3.0" in text  # compact, shrink, grow
        assert 'gpupool_kv_compactions_total{outcome="done"} 1.0' in text
        assert 'gpupool_kv_sidecar_decisions_total{action="grow",status="done"} 1.0' in text
        assert f"gpupool_kv_usable_blocks {float(POOL_BLOCKS)}" in text

        def post(token: str) -> int:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/shrink",
                b'{"num_blocks": 512}',
                {"Authorization": f"Bearer {token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert post("wrong") == 401
        assert post(served.token) == 202
        asked, shrunk = worker.poll()
        assert (asked.action, asked.num_blocks) == ("shrink", 512)
        assert shrunk is not None and shrunk["usable_blocks"] == 512
    finally:
        http.shutdown()


def test_cli_talks_to_the_plugin_and_reports_a_bad_token(served: Served, tmp_path: Path) -> None:
    runner = CliRunner()
    common = ["--socket", str(served.socket), "--token-file", str(served.token_file)]
    status = runner.invoke(app, ["kv-sidecar", "status", *common])
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["original_blocks"] == POOL_BLOCKS
    compacted = runner.invoke(app, ["kv-sidecar", "compact", *common])
    assert compacted.exit_code == 0 and json.loads(compacted.stdout)["status"] in ("done", "noop")
    one_poll = runner.invoke(
        app,
        [
            "kv-sidecar", "run", *common, "--metrics-url", served.server.url + "/metrics",
            "--listen", f"127.0.0.1:{free_port()}", "--polls", "1",
        ],
    )  # fmt: skip
    assert one_poll.exit_code == 0, one_poll.output
    assert json.loads(one_poll.stderr.strip().splitlines()[-1])["decision"]["action"] in (
        "none",
        "compact",
        "shrink",
        "grow",
    )
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token")
    refused = runner.invoke(
        app, ["kv-sidecar", "status", "--socket", str(served.socket), "--token-file", str(wrong)]
    )
    assert refused.exit_code == 1 and "unauthorized" in refused.output
