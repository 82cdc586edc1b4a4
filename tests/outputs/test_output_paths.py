"""Generated output paths against a policy repository with a mount inside: ``render --out``
and ``whatif --json/--markdown/--plots`` either write their files or refuse with one line,
and whatever they do, no input, no file on the mounted filesystem and nothing of the earlier
render is lost, and no staging folder is left.

The layout holds the policy and its model configs, a production trace, an earlier render
with a tmpfs mounted inside it (``build/cache``), a tmpfs mounted beside it (``mnt``) and a
symlink to the policy folder. Paths are drawn from those places joined with tails that
climb, descend or name an input again. ``whatif``'s replay is computed once for real and
returned for every example (the paths are under test, not the replay).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from infra.builders.stack_options import StackOptions
from policy import DEFAULT_POLICY, load_policy
from runtime.atomic_file import STAGING
from runtime.cli import whatif_commands
from runtime.cli.app import app
from runtime.sim.options import Options
from runtime.sim.traces import bundled
from runtime.sim.whatif import Result
from tests.harness.mounts import tmpfs

runner = CliRunner()

PLACES = [
    "",
    "policy",
    "policy/pool.yaml",
    "policy/models",
    "traces",
    "traces/prod.csv",
    "build",
    "build/cache",
    "build/cache/inner",
    "mnt",
    "link",
    "new",
]
TAILS = ["", "out", "..", "../policy", "./pool.yaml", "models/..", "a/b"]
paths = st.builds(
    lambda place, tail: os.path.join(place, tail), *(st.sampled_from(x) for x in (PLACES, TAILS))
)


@pytest.fixture(scope="module")
def replayed() -> Result:
    options = Options(
        None, (), (), 1.0, 0.05, 0, "policy", False, "policy", 0.6, 300.0, StackOptions()
    )
    return whatif_commands.replay(DEFAULT_POLICY, options, "a short replay")


def _snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``: bytes and mode of files, symlink targets, folders."""
    found: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = (path.read_bytes(), path.stat().st_mode)
            else:
                found[rel] = ("folder", path.stat().st_mode)
    return found


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The layout's files (a render included), copied for every example."""
    root = tmp_path_factory.mktemp("layout")
    shutil.copytree(DEFAULT_POLICY.parent / "models", root / "policy/models")
    shutil.copy(DEFAULT_POLICY, root / "policy/pool.yaml")
    (root / "traces").mkdir()
    shutil.copy(bundled("alibaba"), root / "traces/prod.csv")
    done = runner.invoke(
        app, ["render", str(root / "policy/pool.yaml"), "--out", str(root / "build")]
    )
    assert done.exit_code == 0, done.output
    return root


@contextmanager
def _layout(template: Path) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpupool-paths-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        shutil.copytree(template, root, symlinks=True, dirs_exist_ok=True)
        for mount in ("build/cache", "mnt"):
            stack.enter_context(tmpfs(root / mount, size_kib=4096))
            (root / mount / "precious").write_text("on another filesystem\n")
        (root / "link").symlink_to("policy")
        yield root


def _kept(before: dict[str, object], after: dict[str, object], prefixes: list[str]) -> None:
    for rel, entry in before.items():
        if any(rel == p or rel.startswith(p + "/") for p in prefixes):
            assert after.get(rel) == entry, rel


def _checked(result_output: str, exit_code: int, root: Path, before: dict[str, object]) -> bool:
    """One line or success; what no command may lose is kept; no staging left. True: wrote."""
    assert exit_code in (0, 1), result_output
    assert "Traceback" not in result_output
    after = _snapshot(root)
    assert not [rel for rel in after if STAGING in rel]
    precious = ["policy", "traces", "build/cache/precious", "mnt/precious"]
    _kept(before, after, precious)
    if exit_code == 1:
        assert result_output.startswith("error: ") and result_output.count("\n") == 1
        assert after == before  # nothing written, nothing removed
        return False
    return True


@pytest.mark.process
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(out=paths)
@example(out="build")  # holds the mount build/cache
@example(out="mnt")  # is a mount point
@example(out="")  # holds the policy
@example(out="new")
@example(out="traces/prod.csv/..")  # a path through a file
@example(out="traces/models/..")  # through a missing folder
def test_render_out_anywhere(out: str, template: Path) -> None:
    with _layout(template) as root:
        before = _snapshot(root)
        target = root / out
        done = runner.invoke(app, ["render", str(root / "policy/pool.yaml"), "--out", str(target)])
        if _checked(done.output, done.exit_code, root, before):
            assert (target / ".gpupool-render").is_file()


@pytest.mark.process
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(json_out=paths, markdown_out=paths, plots=paths)
@example(json_out="policy/pool.yaml", markdown_out="traces/prod.csv", plots="new")
@example(json_out="new/r.json", markdown_out="new/r.md", plots="new")
@example(json_out="build/cache/r.json", markdown_out="r.md", plots="policy")
@example(json_out="out", markdown_out="./pool.yaml", plots="out")  # a file used as a folder
def test_whatif_outputs_anywhere(
    json_out: str,
    markdown_out: str,
    plots: str,
    replayed: Result,
    template: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(whatif_commands, "replay", lambda *_args: replayed)
    with _layout(template) as root:
        before = _snapshot(root)
        args = ["whatif", "--policy", str(root / "policy/pool.yaml")]
        args += ["--prod-trace", str(root / "traces/prod.csv")]
        args += ["--json", str(root / json_out), "--markdown", str(root / markdown_out)]
        args += ["--plots", str(root / plots)]
        done = runner.invoke(app, args)
        if _checked(done.output, done.exit_code, root, before):
            assert (root / json_out).read_bytes().startswith(b"{")
            assert (root / markdown_out).read_text().startswith("## What-if")
            assert (root / plots / "gpus_held.png").read_bytes().startswith(b"\x89PNG")


def _never(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("the long work started")


@pytest.mark.process
@pytest.mark.parametrize("command", ["whatif", "advise", "production-trace"])
def test_a_read_only_folder_is_refused_before_the_long_work(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay, the sweep and the Prometheus queries never start (they would fail)."""
    from runtime.cli import advise_commands, trace_commands

    monkeypatch.setattr(whatif_commands, "replay", _never)
    monkeypatch.setattr(advise_commands, "run_sweep", _never)
    monkeypatch.setattr(trace_commands, "connect", _never)
    with tmpfs(tmp_path / "ro", size_kib=64, read_only=True) as folder:
        args = {
            "whatif": ["whatif", "--example", "--markdown", str(folder / "r.md")],
            "advise": ["advise", "--example", "--out", str(folder / "advice")],
            "production-trace": [
                *("production-trace", "--example", "--prometheus", "http://127.0.0.1:9"),
                *("--out", str(folder / "p.csv")),
            ],
        }[command]
        done = runner.invoke(app, args)
        assert done.exit_code == 1, done.output
        last = done.output.strip().splitlines()[-1]
        assert last.endswith(f"cannot write in {folder} (read-only filesystem); nothing written")
        assert not any(folder.iterdir())


@pytest.mark.process
def test_production_trace_never_overwrites_the_policy(
    tmp_path: Path, template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.cli import trace_commands

    monkeypatch.setattr(trace_commands, "connect", _never)
    with _layout(template) as root:
        before = _snapshot(root)
        policy = root / "policy/pool.yaml"
        model = root / "policy" / load_policy(policy).workloads[0].hf_config
        for out in (policy, model):
            args = ["production-trace", "--policy", str(policy), "--out", str(out)]
            done = runner.invoke(app, [*args, "--prometheus", "http://127.0.0.1:9"])
            assert done.exit_code == 1
            assert done.output == f"error: {out}: is an input of this command; name another path\n"
        assert _snapshot(root) == before
