"""Session-wide real servers: one vLLM engine per test run, started only if a test asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.servers import TINY_MODEL, Server, start_vllm_server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real vLLM OpenAI server (CPU build) serving the tiny random-weight model."""
    workdir = tmp_path_factory.mktemp("vllm")
    args = [
        "--model",
        str(TINY_MODEL),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--block-size",
        "32",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
        "--enforce-eager",
    ]
    server = start_vllm_server(args, workdir)
    yield server
    server.stop()
