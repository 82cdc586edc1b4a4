"""The exit status of a command that Ctrl-C interrupts: 0 with one line when its outputs
were in place and no further write was announced, 130 (the shell's convention) otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness.servers import REPO

pytestmark = pytest.mark.process

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from runtime import atomic_file
    from runtime.cli.app import app, main

    @app.command("probe")
    def probe(announce: bool = False, write: bool = True) -> None:
        if write:
            atomic_file.write_atomic(Path("first.txt"), "done\\n")
        if announce:  # a second output to come, as the demo's replay after its render
            atomic_file.check_outputs([Path("second.txt")])
        os.kill(os.getpid(), signal.SIGINT)
        print("summary")

    sys.argv = ["gpupool", "probe", *sys.argv[1:]]
    main()
    """
)


def _probe(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_an_interrupt_after_the_outputs_exits_0_and_names_them(tmp_path: Path) -> None:
    done = _probe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["interrupted after writing first.txt: they are complete"], (
        done.stderr
    )
    assert (tmp_path / "first.txt").read_text() == "done\n"


@pytest.mark.parametrize(
    "args", [("--no-write",), ("--announce",)], ids=["nothing-written", "more-to-come"]
)
def test_an_interrupt_before_the_last_output_exits_130(tmp_path: Path, args: tuple[str]) -> None:
    done = _probe(tmp_path, *args)
    assert done.returncode == 130, done.stderr
    assert "interrupted after writing" not in done.stderr
