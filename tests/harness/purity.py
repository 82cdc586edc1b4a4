"""A guard that keeps the pure test loop pure.

``make test-fast`` runs the tests that need nothing but this interpreter: no server, no engine,
no vLLM import, no other program. A test that needs more carries a marker (``slow``, ``vllm``,
``process``: pyproject.toml says what each means), on the test or as the file's ``pytestmark``.
The fast loop sets ``GPUPOOL_PURE_TESTS=1``; the guard then fails any test that starts a process
or imports vLLM, so a missing marker is found the first time the loop runs the test, not when
the loop quietly slows down.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Sequence
from enum import StrEnum
from types import ModuleType
from typing import Any

import pytest

PURE_ENV = "GPUPOOL_PURE_TESTS"


class Need(StrEnum):
    """A marker: what beyond this interpreter a test needs."""

    VLLM = "vllm"  # imports the vLLM package (the CPU build)
    PROCESS = "process"  # runs another program: promtool, amtool, kubectl, git, checkov, a CLI


class ImpureTest(RuntimeError):
    """Raised by the guard: not an ImportError or OSError, so no fallback can swallow it."""


class _NoVllm(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ImpureTest(f"imports {fullname}: mark the test file {Need.VLLM.value}")
        return None


def _no_process(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    raise ImpureTest(f"runs {args!r}: mark the test file {Need.PROCESS.value}")


def guarding() -> bool:
    return os.environ.get(PURE_ENV) == "1"


def guard() -> None:
    """Make starting a process or importing vLLM fail loudly from here on.

    Installed once collection is done, so a test file that imports vLLM at its top is found by
    ``vllm_importers`` instead of breaking the collection of the whole run.
    """
    sys.meta_path.insert(0, _NoVllm())
    subprocess.Popen.__init__ = _no_process  # type: ignore[method-assign]


def vllm_importers(items: Sequence[pytest.Item]) -> list[str]:
    """Selected test files whose module holds something from vLLM (imported at collection)."""
    files = set()
    modules = {getattr(item, "module", None): item for item in items}
    for module, item in modules.items():
        if module is None:
            continue
        for value in vars(module).values():
            name = getattr(value, "__module__", None) or getattr(value, "__name__", "")
            if isinstance(name, str) and (name == "vllm" or name.startswith("vllm.")):
                files.add(str(item.path))
                break
    return sorted(files)
