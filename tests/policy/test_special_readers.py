"""Every reader of the policy file refuses a FIFO and ``/dev/zero`` with one line, and
``gpupool schema --out`` writes through the atomic writer.

Each reader runs in a child process with a timeout: opening a FIFO for reading blocks, so a
reader that opened it unchecked would hang instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import hostile as h

ROOT = Path(__file__).resolve().parents[2]

READERS = {
    "loader": "from policy.loader import read_text\nread_text(PATH)\n",
    "sidecar": (
        "from runtime.kvcache.sidecar.policy_file import PolicyFile\nPolicyFile(PATH).load()\n"
    ),
}
"""Each reader, given the policy at ``PATH``; a refusal is a ``PolicyError``."""


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "character device":
        return Path("/dev/zero")
    path = tmp_path / "pool.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.process
@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_each_reader_refuses_a_special_file(tmp_path: Path, reader: str, kind: str) -> None:
    path = _special(tmp_path, kind)
    program = (
        "from pathlib import Path\nfrom policy import PolicyError\n"
        f"PATH = Path({str(path)!r})\ntry:\n"
        + "".join(f"    {line}\n" for line in READERS[reader].splitlines())
        + "except PolicyError as exc:\n    print(exc)\nelse:\n    print('read')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,  # the hang guard: an unchecked open of a FIFO never returns
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}:0: expected a regular file, found a {kind}"


def test_schema_out_replaces_the_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    out.write_text("old\n")
    out.chmod(0o640)
    result = h.runner.invoke(h.app, ["schema", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["title"] == "PoolPolicy"
    assert out.stat().st_mode & 0o777 == 0o640  # the atomic writer keeps an existing mode
    assert [p.name for p in tmp_path.iterdir()] == ["schema.json"]  # no staging left


def test_schema_out_through_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("kept\n")
    out = tmp_path / "file" / "schema.json"
    result = h.runner.invoke(h.app, ["schema", "--out", str(out)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {out}: {out.parent} is not a folder"
    assert (tmp_path / "file").read_text() == "kept\n"
