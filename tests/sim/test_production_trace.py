"""The owner's production trace as a CSV, and ``gpupool production-trace``'s refusals.

The range queries themselves run on a real Prometheus in tests/sim/test_budget_promql.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli.app import app
from runtime.sim.traces import TraceError, demand_csv, load_production_trace
from tests.harness.servers import free_port

runner = CliRunner()


def test_samples_round_trip_through_the_generic_csv(tmp_path: Path) -> None:
    samples = [(1000.0, 8.0, 2.0), (1060.0, 12.0, 12.0), (1120.0, 0.0, 0.0), (1180.0, 4.0, 5.0)]
    path = tmp_path / "p.csv"
    path.write_text(demand_csv(samples, source="test"))
    assert path.read_text().splitlines()[:2] == [
        "timestamp,gpus_demanded,duty_cycle",
        "0,8,0.250000",
    ]
    trace = load_production_trace(path)
    assert trace.held.tolist() == [8, 12, 0, 4]
    assert trace.busy.tolist() == [2.0, 12.0, 0.0, 4.0]  # duty clipped to 1
    assert trace.step_s == 60.0


def test_gpus_no_busy_figure_covers_are_refused() -> None:
    with pytest.raises(TraceError, match="at 1 of 2 steps that dcgm-exporter does not attribute"):
        demand_csv([(0.0, 4.0, 1.0), (60.0, 4.0, None)], source="test")
    assert demand_csv([(0.0, 0.0, None), (60.0, 0.0, None)], source="test").count("\n") == 3


def test_one_sample_is_not_a_trace() -> None:
    with pytest.raises(TraceError, match="expected 2 samples at least, found 1"):
        demand_csv([(0.0, 4.0, 1.0)], source="test")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--window", "1x"], "expected a Prometheus duration"),
        (["--window", "1m", "--step", "1m"], "must hold two --step 1m at least"),
        (["--window", "400d", "--step", "1m"], "576,000 samples, over 100,000"),
        ([], "ConnectionError"),
    ],
)
def test_bad_input_and_an_unreachable_prometheus_are_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "p.csv"
    url = f"http://127.0.0.1:{free_port()}"
    args = ["production-trace", "--prometheus", url, "--out", str(out), "--window", "1h"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 1
    assert message in " ".join(result.output.split()), result.output
    assert len(result.output.strip().splitlines()) <= 2  # the policy line, the error
    assert not out.exists()
