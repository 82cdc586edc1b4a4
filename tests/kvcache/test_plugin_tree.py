"""The plugin as the flex pod ships it: a ``pip install --no-deps --target`` tree on PYTHONPATH.

This is what ``infra/images/runtime.Dockerfile`` builds and the pod's initContainer copies
into the stock vLLM image. vLLM's own plugin loader must find the entry point in that tree and
the plugin must import nothing vLLM's image lacks (gpupool's other dependencies are not
there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # imports vLLM in a fresh interpreter (~15 s)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "policy", "infra", "alerts", "runtime")

PIP_TARGET = ("--no-build-isolation", "--no-compile", "--no-deps", "--target")
"""The Dockerfile's ``--no-deps --target`` install; no build isolation, so no network."""

PROBE = """
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.engine.core import EngineCore
from vllm.v1.worker.worker_base import WorkerBase
import runtime.kvcache.in_vllm.engine_control
import runtime.kvcache.in_vllm.scheduler_side
import runtime.kvcache.in_vllm.worker_side
print(json.dumps({
    "plugin": sys.modules["runtime.kvcache.in_vllm.plugin"].__file__,
    "engine_hook": hasattr(EngineCore, "gpupool_kv"),
    "worker_hook": hasattr(WorkerBase, "gpupool_kv_resize"),
    "outside_vllm_image": sorted(
        {m.split(".")[0] for m in sys.modules} & {"policy", "infra", "alerts", "ruamel", "typer"}
    ),
}))
"""


@pytest.fixture(scope="module")
def plugin_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's ``pip install --no-deps --target`` of a copy of this checkout."""
    work = tmp_path_factory.mktemp("plugin")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, source / name)
    tree = work / "tree"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *PIP_TARGET, str(tree), str(source)],
        check=True,
        timeout=300,
    )
    return tree


def test_vllm_loads_the_plugin_from_the_tree_on_pythonpath(plugin_tree: Path) -> None:
    (dist_info,) = plugin_tree.glob("gpupool-*.dist-info")
    assert (
        "gpupool_kvcache = runtime.kvcache.in_vllm.plugin:register"
        in (dist_info / "entry_points.txt").read_text()
    )
    env = dict(os.environ, PYTHONPATH=str(plugin_tree), GPUPOOL_KV_COMPACTION="1")
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=plugin_tree.parent,  # not the checkout: only the tree may provide gpupool
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(found["plugin"]).is_relative_to(plugin_tree)
    assert found["engine_hook"] and found["worker_hook"]
    assert found["outside_vllm_image"] == []
