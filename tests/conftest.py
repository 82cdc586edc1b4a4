"""Session-wide real servers: one vLLM engine per test run, started only if a test asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.vllm import render_args
from tests.harness import purity
from tests.harness.servers import Server, free_port, start_vllm_server
from tests.harness.tiny_engine import TEST_ONLY_ARGS, tiny_plan


def pytest_collection_finish(session: pytest.Session) -> None:
    if not purity.guarding():
        return
    importers = purity.vllm_importers(session.items)
    if importers:
        raise pytest.UsageError(
            f"{purity.PURE_ENV}=1 but these test files import vLLM: mark them "
            f"{purity.Need.VLLM.value}: {', '.join(importers)}"
        )
    purity.guard()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real vLLM OpenAI server (CPU build) serving the tiny random-weight model.

    Started with the arguments runtime.vllm generates for tests/fixtures/tiny-policy.yaml
    (``tests.harness.tiny_engine.tiny_plan``), so the shared server proves them.
    """
    port = free_port()
    plan = tiny_plan(port)
    server = start_vllm_server(
        [*render_args(plan), *TEST_ONLY_ARGS],
        tmp_path_factory.mktemp("vllm"),
        port=port,
        env=dict.fromkeys(plan.env_unset),
    )
    yield server
    server.stop()
