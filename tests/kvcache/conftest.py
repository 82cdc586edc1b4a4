"""One real in-process vLLM engine with the gpupool plugin active, shared by the engine tests."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.kvcache.in_vllm import plugin
from tests.harness.servers import TINY_MODEL
from tests.kvcache.engine import TOTAL_BLOCKS, Engine, start_engine

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # scheduler and worker in this process
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "GPUPOOL_KV_COMPACTION": "1",
}


@pytest.fixture(scope="session")
def control_token(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """Socket path, token file and token for the plugin's control socket."""
    workdir = tmp_path_factory.mktemp("kvctl")
    token = secrets.token_hex(16)
    token_file = workdir / "token"
    token_file.write_text(token + "\n")
    return workdir / "kv.sock", token_file, token


@pytest.fixture(scope="session")
def engine(control_token: tuple[Path, Path, str]) -> Iterator[Engine]:
    socket, token_file, _ = control_token
    env = {**ENGINE_ENV, "GPUPOOL_KV_SOCKET": str(socket), "GPUPOOL_KV_TOKEN_FILE": str(token_file)}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    handle = start_engine(TINY_MODEL, TOTAL_BLOCKS)
    # restore at once: servers other tests start inherit os.environ and must not take the socket
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    yield handle
    control = plugin.state(handle.core).control
    assert control is not None
    control.close()
