"""Hostile trace files, generated: every load gives a trace or one clear line, in bounded memory.

The rows come from a grammar of good and malformed ones (``tests.harness.hostile``), arriving
in bursts or spread out, truncated, gzipped or cut short. Special files and decompression
bombs are refused before they are read whole; memory is measured as the peak RSS of a child
process (``ru_maxrss``), with inputs sized so the old whole-file reads would pass the bound
several times over.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from runtime.sim.traces import (
    FlexTrace,
    ProductionTrace,
    TraceError,
    load_flex_trace,
    load_production_trace,
)
from tests.harness import hostile as h

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h.trace_files())
def test_generated_trace_files_load_or_fail_on_one_line(file: tuple[str, str, bytes]) -> None:
    kind, name, data = file
    load = load_production_trace if kind in ("demand", "alibaba") else load_flex_trace
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            trace = load(path)
        except TraceError as exc:
            message = str(exc)
            assert "\n" not in message, message
            assert re.match(rf"{re.escape(str(path))}(:[0-9]+)?: .*expected", message), message
        else:
            assert isinstance(trace, ProductionTrace | FlexTrace) and trace.duration_s >= 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli.app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a hang (a FIFO opened for reading) fails instead of stalling the suite
        check=False,
    )


@pytest.mark.process
@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory"])
@pytest.mark.parametrize("option", ["--flex-trace", "--prod-trace"])
def test_special_files_are_refused_before_reading(tmp_path: Path, kind: str, option: str) -> None:
    special = {"character device": Path("/dev/zero"), "directory": tmp_path}.get(kind)
    if special is None:
        special = tmp_path / "fifo.csv"
        os.mkfifo(special)
    done = _cli("whatif", option, str(special), "--hours", "0.1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    *notes, line = done.stderr.strip().splitlines()  # notes: which policy file was used
    assert line == f"error: {special}: expected a regular file, found a {kind}", line
    assert all(note.startswith("policy: ") for note in notes), notes


def _peak_growth(code: str) -> dict[str, object]:
    """Run ``code`` in a child (it sets ``outcome``); its peak RSS growth in MiB over what the
    imports took, and the outcome."""
    program = (
        "import json, resource\n"
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from runtime.sim import traces\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{code}\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'growth_mib': (after - before) / 1024, 'outcome': outcome}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.process
def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.csv.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip container
    with bomb.open("wb") as out:
        row = b"2023-11-16 18:15:46.0000000,100,10\n"
        out.write(packer.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n"))
        for _ in range(64):  # 64 MiB inflated
            out.write(packer.compress(row * (MIB // len(row))))
        out.write(packer.flush())
    assert bomb.stat().st_size < MIB
    measured = _peak_growth(
        "traces.TRACE_BYTES = 8 * 1024 * 1024\n"
        "try:\n"
        f"    traces.load_flex_trace(Path({str(bomb)!r}))\n"
        "    outcome = 'loaded'\n"
        "except traces.TraceError as exc:\n"
        "    outcome = str(exc)\n"
    )
    assert measured["outcome"] == f"{bomb}: expected at most 8 MiB, found more"
    assert isinstance(measured["growth_mib"], float) and measured["growth_mib"] < 24, measured


@pytest.mark.process
def test_a_burst_tiled_to_a_day_is_refused_before_its_arrays_exist() -> None:
    measured = _peak_growth(
        "n = 20_000\n"
        "burst = traces.FlexTrace('burst.csv', np.linspace(0, 0.999, n), np.full(n, 100),\n"
        "    np.full(n, 10), np.zeros(n, dtype=np.int64), np.full(n, np.nan), 0)\n"
        "try:\n"
        "    burst.tiled(86_400)\n"
        "    outcome = 'tiled'\n"
        "except traces.TraceError as exc:\n"
        "    outcome = str(exc)\n"
    )
    assert str(measured["outcome"]).startswith(
        "burst.csv: expected at most 10,000,000 requests in a replay, found 1,728,000,000 "
        "(20,000 requests every 1 s"
    ), measured
    assert isinstance(measured["growth_mib"], float) and measured["growth_mib"] < 16, measured


@pytest.mark.process
@pytest.mark.parametrize(
    ("write", "bound"), [(h.write_azure_trace, 2.0), (h.write_mooncake_trace, 5.0)]
)
def test_a_trace_takes_memory_in_flat_arrays(tmp_path: Path, write: object, bound: float) -> None:
    """Whole-file reads took 7-8 times the file (bytes, text, a string a line, a Python int
    an id); flat arrays take 1-4 times."""
    path = tmp_path / "trace.txt"
    assert callable(write)
    write(path, 8 * MIB)
    measured = _peak_growth(f"outcome = traces.load_flex_trace(Path({str(path)!r})).arrival_s.size")
    assert isinstance(measured["outcome"], int) and measured["outcome"] > 10_000
    assert isinstance(measured["growth_mib"], float) and measured["growth_mib"] < 8 * bound, (
        measured
    )


def test_production_readers_refuse_special_files_too() -> None:
    with pytest.raises(
        TraceError, match=r"^/dev/zero: expected a regular file, found a character device$"
    ):
        load_production_trace(Path("/dev/zero"))
