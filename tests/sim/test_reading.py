"""Output a person reads: tables whole at any width, report links from the report's folder,
one line per dropped request share and per MISSED goal with its cause, and an evictions plot
that counts what the table counts."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import matplotlib.figure
import pytest
from rich.console import Console
from typer.testing import CliRunner

from policy import PoolPolicy, load_policy
from runtime.cli import infra_commands, tables, whatif_commands
from runtime.cli.app import app
from runtime.cli.whatif_options import OutputPaths
from runtime.sim import markdown
from runtime.sim.whatif import Result
from tests.sim.test_headline import HOUR, _flat, _ints, _replay, _result
from tests.sim.test_whatif_cli import _policy_copy

runner = CliRunner()

WIDE = (
    ("workload", "pool", "gpus_per_replica", "replicas", "replicas_at_most", "derivation"),
    (
        "llama-8b-instruct-flex-long-name",
        "gpu-flex-spot-east",
        "1",
        "1-96",
        "96",
        "max_replicas auto: the flex pool's GPUs over gpus_per_replica, capped by the budget",
    ),
)


def _terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    console = Console(
        file=out, force_terminal=True, color_system=None, width=width, highlight=False
    )
    return console, out


def _in_order(text: str, value: str) -> bool:
    """Every character of ``value`` appears in ``text`` in order (a folded cell)."""
    rest = iter(re.sub(r"\s", "", text))
    return all(ch in rest for ch in re.sub(r"\s", "", value))


def test_a_wide_table_on_an_80_column_terminal_keeps_every_value() -> None:
    console, out = _terminal()
    headers, row = WIDE
    tables.print_table(console, headers, [row], title="Flex workloads")
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for value in (*headers, *row):
        assert _in_order(text, value), value


def test_off_a_terminal_a_table_is_markdown_one_line_per_row() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False)  # a pipe: not a terminal
    headers, row = WIDE
    tables.print_table(console, headers, [row, ("a|b", "", "", "", "", "")], title="T")
    lines = out.getvalue().splitlines()
    assert lines[0] == "T"
    assert lines[1] == "| " + " | ".join(headers) + " |"
    assert lines[2] == "|---|---|---|---|---|---|"
    assert lines[3] == "| " + " | ".join(row) + " |"  # longer than 80: never cut or wrapped
    assert lines[4].startswith("| a\\|b |")
    assert len(lines) == 5


def test_demo_tables_keep_every_value_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's summary on an 80-column terminal, and piped (CliRunner is not a terminal)."""
    console, out = _terminal()
    monkeypatch.setattr(infra_commands, "console", console)
    monkeypatch.setattr(infra_commands, "replay_demo", lambda *_: None)
    args = ["demo", "--example", "--out", str(tmp_path / "t")]
    assert runner.invoke(app, args, env={"COLUMNS": "80"}).exit_code == 0
    policy = load_policy()
    names = [w.name for w in policy.workloads] + [p.name for p in policy.node_pools]
    text = out.getvalue()
    assert "…" not in text and all(_in_order(text, n) for n in names)
    monkeypatch.undo()
    monkeypatch.setattr(infra_commands, "replay_demo", lambda *_: None)
    piped = runner.invoke(app, ["demo", "--example", "--out", str(tmp_path / "p")])
    assert piped.exit_code == 0, piped.output
    assert "…" not in piped.output
    rows = [line for line in piped.output.splitlines() if line.startswith("| ")]
    for name in names:  # whole, in a markdown row
        assert any(f"| {name} |" in row for row in rows), name


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real one-hour replay of the shipped policy on the bundled traces, run from another
    folder, the report and the plots in sibling folders."""
    tmp = tmp_path_factory.mktemp("replay")
    policy = _policy_copy(tmp)
    report, plots, cwd = tmp / "report" / "r.md", tmp / "plots", tmp / "cwd"
    cwd.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        args = ["whatif", "--policy", str(policy), "--hours", "1", "--json", "r.json"]
        args += ["--markdown", str(report), "--plots", "../plots"]
        result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return {
        "stdout": result.stdout,
        "report": report,
        "plots": plots,
        "data": json.loads((cwd / "r.json").read_text()),
        "policy": load_policy(policy),
    }


def test_report_links_resolve_from_the_report_folder(replayed: dict[str, Any]) -> None:
    report: Path = replayed["report"]
    links = re.findall(r"^!\[[^]]*\]\(([^)]+)\)$", report.read_text(), flags=re.M)
    assert links and all(link.startswith("../plots/") for link in links)
    for link in links:
        assert (report.parent / link).resolve().is_file(), link


def test_each_drop_is_one_line_with_count_share_cause_and_fix(replayed: dict[str, Any]) -> None:
    data, policy = replayed["data"], replayed["policy"]
    limits = {w.name: w.max_model_len for w in policy.workloads}
    dropped = {n: r for n, r in data["pooled"]["requests"].items() if r["dropped"]}
    assert dropped, "the bundled traces hold requests over max_model_len"
    report = replayed["report"].read_text().splitlines()
    for text in (report, replayed["stdout"].splitlines()):
        lines = [line for line in text if line.startswith("- DROPPED: ")]
        assert len(lines) == len(dropped)
        for line, (name, r) in zip(lines, dropped.items(), strict=True):
            total = r["arrived"] + r["dropped"]
            assert f"{r['dropped']:,} of {total:,} {name} requests" in line
            assert f"({r['dropped'] / total:.1%})" in line
            assert f"max_model_len ({limits[name]:,} tokens)" in line
            assert "vLLM refuses" in line and f"raise {name}'s max_model_len" in line
    assert report.index("Notable:") < report.index("| | pooled | fixed |")


def test_each_missed_goal_is_one_line_with_its_cause(replayed: dict[str, Any]) -> None:
    goals = replayed["data"]["goals"]
    missed = [g for g in goals if g["met"] is False]
    assert missed, "the one-hour demo misses a goal (the flex trace leaves flex idle)"
    assert all(g["cause"] for g in missed)
    assert all(g["cause"] is None for g in goals if g["met"] is not False)
    for text in (replayed["report"].read_text(), replayed["stdout"]):
        for goal in missed:
            assert f"- MISSED: {goal['name']}: {goal['cause']}\n" in text


def test_the_evictions_plot_counts_the_tables_evictions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plotted bars (read from the figure, not the pixels) sum to the evicted pods the
    table and the plot's title name; the goal line counts the same series."""
    policy: PoolPolicy = load_policy()
    evictions = [0] * HOUR
    evictions[10], evictions[11], evictions[200] = 3, 1, 2
    common = {"total": _ints(16), "prod_busy": _flat(4.0)}
    pooled = _replay(
        "pooled",
        flex_running=_ints(8),
        flex_duty=_flat(1.0),
        evictions=evictions,
        **common,  # type: ignore[arg-type]
    )
    fixed = _replay("fixed", flex_running=_ints(8), flex_duty=_flat(1.0), **common)  # type: ignore[arg-type]
    result: Result = _result(policy, pooled, fixed)
    plotted: dict[str, Any] = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig: matplotlib.figure.Figure, *args: Any, **kwargs: Any) -> None:
        ax = fig.axes[0]
        plotted[ax.get_title()] = [patch.get_height() for patch in ax.patches]
        save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    whatif_commands.write_outputs(
        result, OutputPaths(plots=tmp_path / "plots", markdown_out=tmp_path / "r.md")
    )
    (title,) = [t for t in plotted if t.startswith("Flex evictions")]
    assert sum(plotted[title]) == result.pooled.evictions_total == 6
    cells = {name: cell for name, cell, _ in markdown.rows(result.pooled, result.fixed)}
    evicted = cells["flex pods evicted (running replicas)"]
    assert evicted == "6 (0)" and "6 pods" in title
    report = (tmp_path / "r.md").read_text()
    assert f"| flex pods evicted (running replicas) | {evicted} |" in report
