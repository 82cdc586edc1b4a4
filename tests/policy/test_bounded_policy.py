"""Policy files past the shapes a policy has: merge keys, deep nesting, huge files, special
files as the policy or as a model config, and node lists near the API server's largest.

Each is refused (or, for merge keys, accepted) with one ``FILE:LINE: ...`` line a problem and
no traceback; node name checks do a bounded number of comparisons a node.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from policy import parse_policy
from policy.base import Invariants
from policy.bounded_read import POLICY_BYTES
from tests.harness import hostile as h
from tests.infra.policies import edited
from tests.infra.test_cli import write_policy

ROOT = Path(__file__).resolve().parents[2]
CASES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _dumped(doc: Any) -> str:
    out = io.StringIO()
    YAML(typ="rt").dump(doc, out)
    return out.getvalue()


def _one_line_each(source: Path, text: str, *, expect_ok: bool | None = None) -> list[str]:
    """Run validate on ``text`` written to ``source``: success, or exit 1 with every line
    ``FILE:LINE: message``; no traceback either way. The problem lines."""
    source.write_text(text)
    result = h.runner.invoke(h.app, ["validate", str(source)])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if expect_ok is not None:
        assert (result.exit_code == 0) == expect_ok, result.output
    if result.exit_code == 0:
        return []
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines
    for line in lines:
        assert re.match(rf"{re.escape(str(source))}:[0-9]+: \S", line), line
    return lines


POOL_FIELDS = ["gpus_per_node", "max_nodes", "gpu_memory_gib", "reserve_ratio", "name", "role"]


@CASES
@given(
    field=st.sampled_from(POOL_FIELDS),
    value=st.one_of(h.numbers, h.any_text, st.none()),
    in_anchor=st.booleans(),
)
def test_merge_keys_are_read_and_their_problems_located(
    field: str, value: Any, in_anchor: bool
) -> None:
    """The second pool merges the first (``<<: *first``) and overrides some keys; a bad value
    sits in the anchor or in the merging mapping."""
    doc = edited()
    first, second = doc.pop("node_pools")[:2]
    if value is not None:
        (first if in_anchor else second)[field] = value
    shown = {k: v for k, v in second.items() if k not in first or first[k] != v}
    entries = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in shown.items())
    text = _dumped(doc) + (
        f"node_pools:\n  - &first {json.dumps(first)}\n  - {{<<: *first, {entries}}}\n"
    )
    with tempfile.TemporaryDirectory() as folder:
        source = write_policy(Path(folder), {})
        for line in _one_line_each(source, text):
            number = int(line.split(":")[1])
            assert 1 <= number <= text.count("\n"), line


@pytest.mark.heavy
@CASES
@given(
    depth=st.sampled_from([1, 10, 300, 1_000, 10_000, 100_000]),
    style=st.sampled_from(["[", "{a: ", "- "]),
)
def test_deep_nesting_is_one_line(depth: int, style: str) -> None:
    if style == "- ":
        nest = "\nextra:\n  " + "- " * depth + "x\n"
    else:
        close = {"[": "]", "{a: ": "}"}[style]
        nest = "\nextra: " + style * depth + "x" + close * depth + "\n"
    with tempfile.TemporaryDirectory() as folder:
        source = write_policy(Path(folder), {})
        lines = _one_line_each(source, _dumped(edited()) + nest, expect_ok=False)
    assert any("extra" in line or "nested more than 64" in line for line in lines), lines


def test_a_policy_larger_than_the_cap_is_refused_unread(tmp_path: Path) -> None:
    source = tmp_path / "pool.yaml"
    with source.open("wb") as out:
        out.truncate(POLICY_BYTES + 1024 * 1024)  # sparse: nothing to read but zeros
    result = h.runner.invoke(h.app, ["validate", str(source)])
    assert result.exit_code == 1
    assert result.output.strip() == f"{source}:0: expected at most 16 MiB, found 17.0 MiB"


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli.app", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a FIFO opened for reading would block: fail instead of stalling
        check=False,
    )


@pytest.mark.process
@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_special_files_are_refused_as_the_policy(tmp_path: Path, kind: str) -> None:
    path = Path("/dev/zero") if kind == "character device" else tmp_path / "pool.yaml"
    if kind == "FIFO":
        os.mkfifo(path)
    done = _validate(path)
    assert done.returncode == 1
    assert done.stderr.strip() == f"{path}:0: expected a regular file, found a {kind}"


@pytest.mark.process
@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_special_files_are_refused_as_hf_config(tmp_path: Path, kind: str) -> None:
    config = Path("/dev/zero") if kind == "character device" else tmp_path / "config.json"
    if kind == "FIFO":
        os.mkfifo(config)
    source = write_policy(tmp_path, edited({"workloads.0.hf_config": str(config)}))
    done = _validate(source)
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"{re.escape(str(source))}:[0-9]+: workloads\.0\.hf_config: {re.escape(str(config))}: "
        rf"<file>: expected a regular file, found a {kind}",
        line,
    ), line


class _Counted(str):
    """A node name that counts its equality comparisons."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_node_name_checks_compare_each_name_a_bounded_number_of_times() -> None:
    """Listing each node once took ``n^2 / 2`` comparisons (each against the list before it):
    20 million for 6,000 nodes. Now a dict holds them: about one a node."""
    nodes = 6_000
    policy = parse_policy(edited())
    pools = list(policy.node_pools)
    names = tuple(_Counted(f"node-{i}.ec2.internal") for i in range(nodes))
    pools[0] = pools[0].model_copy(update={"nodes": (*names, names[7])})  # one listed twice
    pools[1] = pools[1].model_copy(update={"nodes": (names[9],)})  # one in two pools
    crowded = policy.model_copy(update={"node_pools": tuple(pools)})
    found = Invariants()
    _Counted.compared = 0
    crowded._check_names(found)
    assert _Counted.compared <= 2 * nodes
    assert [path for path, _ in found._found] == [
        f"node_pools.0.nodes.{nodes}",
        "node_pools.1.nodes.0",
    ]
