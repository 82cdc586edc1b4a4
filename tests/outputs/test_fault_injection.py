"""Kill and interrupt ``render`` and ``whatif`` at random points of their work; what is on
disk is the old set of files or the new one, and the next run removes what was left.

The points are system calls: ``strace --inject`` delivers SIGKILL or SIGINT on entering the
n-th call of one of the calls writing does (mkdir, link, fsync, flock, rename, unlink,
rmdir), n drawn from the counts of an undisturbed run, so kills land in the build, around
the commit and in the clean-up alike. A full disk is a real tmpfs sized to hold the old set
and not a second copy. A SIGKILL between two of ``whatif``'s renames leaves the set mixed
with its commit record on disk; the test checks the record is there and that the next run
finishes the set (the one window the design cannot close without one folder for all files).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from policy import DEFAULT_POLICY
from runtime.atomic_file import STAGING, clean_leftovers
from tests.harness.mounts import remount, tmpfs, used_kib
from tests.harness.servers import REPO

pytestmark = pytest.mark.slow

CALLS = "mkdir,linkat,link,fsync,flock,rename,renameat,renameat2,unlink,unlinkat,rmdir"
STRACE = shutil.which("strace")
needs_strace = pytest.mark.skipif(STRACE is None, reason="strace injects the signals")


def _gpupool(
    args: list[str],
    cwd: Path,
    *,
    strace: tuple[str, ...] = (),
    mpl: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    env["MPLCONFIGDIR"] = str(mpl or cwd.parent / ".mpl")
    command = [sys.executable, "-m", "runtime.cli.app", *args]
    return subprocess.run(
        [*strace, *command], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def _files(root: Path, command: str) -> dict[str, tuple[bytes, int]]:
    """The outputs as a reader sees them (staging folders aside): bytes and mode."""
    found = {}
    for output in OUTPUTS[command]:
        for folder, dirs, files in os.walk(root / output):
            dirs[:] = [d for d in dirs if not d.startswith(STAGING)]
            for name in files:
                path = Path(folder) / name
                found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode)
        if (root / output).is_file():
            found[output] = ((root / output).read_bytes(), (root / output).stat().st_mode)
    return found


def _counts(args: list[str], cwd: Path) -> dict[str, int]:
    """How often the undisturbed run makes each of ``CALLS``."""
    summary = cwd / ".counts"
    assert STRACE is not None
    trace = [STRACE, "-f", "-qq", "-c", "-o", str(summary), "-e", f"trace={CALLS}"]
    done = _gpupool(args, cwd, strace=tuple(trace))
    assert done.returncode == 0, done.stderr
    counts = {}
    for line in summary.read_text().splitlines():
        tokens = line.split()
        if len(tokens) >= 5 and tokens[-1] in CALLS.split(","):
            counts[tokens[-1]] = int(tokens[3])
    summary.unlink()
    return counts


def _prepared(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(DEFAULT_POLICY.parent / "models", folder / "models")
    shutil.copy(DEFAULT_POLICY, folder / "pool.yaml")
    return folder


WHATIF_OUT = ["--json", "r.json", "--markdown", "r.md", "--plots", "img"]
COMMANDS = {
    "render": (
        ["render", "pool.yaml", "--out", "out", "--target", "labels"],
        ["render", "pool.yaml", "--out", "out", "--target", "karpenter"],
    ),
    "whatif": (
        ["whatif", "--policy", "pool.yaml", "--hours", "0.05", *WHATIF_OUT],
        ["whatif", "--policy", "pool.yaml", "--hours", "0.1", *WHATIF_OUT],
    ),
}
OUTPUTS = {"render": ["out"], "whatif": ["r.json", "r.md", "img"]}
TRIALS = {"render": 10, "whatif": 5}


@needs_strace
@pytest.mark.parametrize("command", list(COMMANDS))
def test_killed_or_interrupted_anywhere_old_or_new(tmp_path: Path, command: str) -> None:
    old_args, new_args = COMMANDS[command]
    reference = _prepared(tmp_path, "reference")
    assert _gpupool(old_args, reference).returncode == 0
    old = _files(reference, command)
    counts = _counts(new_args, reference)
    new = _files(reference, command)
    assert old != new and counts
    rng = random.Random(f"{command}-faults")
    outcomes = set()
    for trial in range(TRIALS[command]):
        call = rng.choice(sorted(counts))
        nth = rng.randint(1, counts[call])
        sig = rng.choice(["SIGKILL", "SIGINT"])
        work = _prepared(tmp_path, f"trial-{trial}")
        assert _gpupool(old_args, work).returncode == 0
        assert STRACE is not None
        inject = [STRACE, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={call}"]
        inject += ["-e", f"inject={call}:signal={sig}:when={nth}"]
        done = _gpupool(new_args, work, strace=tuple(inject))
        where = f"{sig} at {call} #{nth}: rc {done.returncode}"
        assert "Traceback" not in done.stderr, where
        now = _files(work, command)
        records = list(work.rglob(f"{STAGING}*/commit"))
        if now not in (old, new):
            assert sig == "SIGKILL" and records, where  # killed between two renames
        if sig == "SIGINT" and now == new:
            assert done.returncode == 0, where  # once the new set is in place: success
        if now == old and now != new:
            assert done.returncode != 0, where
        for folder in {work, *(p.parent for p in work.rglob(f"{STAGING}*"))}:
            clean_leftovers(folder)  # what the next run does first
        after = _files(work, command)
        assert after == (new if records else now), where
        assert after in (old, new), where
        assert not list(work.rglob(f"{STAGING}*")), where
        outcomes.add("new" if after == new else "old")
    assert outcomes == {"old", "new"}  # the points reached both sides of the commit


def test_a_full_disk_fails_in_one_line_and_keeps_the_old_set(tmp_path: Path) -> None:
    old_args, new_args = COMMANDS["whatif"]
    with tmpfs(tmp_path / "disk", size_kib=64 * 1024) as disk:
        work = _prepared(disk, "work")
        old_done = _gpupool(old_args, work, mpl=tmp_path / ".mpl")
        assert old_done.returncode == 0, old_done.stderr
        old = _files(work, "whatif")
        outputs_kib = sum(len(data) for data, _ in old.values()) // 1024
        remount(disk, f"size={used_kib(disk) + outputs_kib // 2}k")  # room for half a new set
        done = _gpupool(new_args, work, mpl=tmp_path / ".mpl")
        assert done.returncode == 1, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and line.endswith(
            "No space left on device; nothing written"
        ), done.stderr
        assert _files(work, "whatif") == old
        assert not list(work.rglob(f"{STAGING}*"))


def _writes(args: list[str], cwd: Path) -> int:
    """How many ``write`` calls the undisturbed run makes (its last prints the summary)."""
    trace = cwd / ".writes"
    assert STRACE is not None
    done = _gpupool(args, cwd, strace=(STRACE, "-f", "-qq", "-o", str(trace), "-e", "trace=write"))
    assert done.returncode == 0, done.stderr
    count = sum(1 for line in trace.read_text().splitlines() if " write(" in line)
    trace.unlink()
    return count


@needs_strace
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_interrupt_in_the_closing_lines_exits_0_with_the_new_set(
    tmp_path: Path, command: str
) -> None:
    old_args, new_args = COMMANDS[command]
    reference = _prepared(tmp_path, "reference")
    assert _gpupool(old_args, reference).returncode == 0
    last = _writes(new_args, reference)
    new = _files(reference, command)
    work = _prepared(tmp_path, "work")
    assert _gpupool(old_args, work).returncode == 0
    assert STRACE is not None
    inject = (STRACE, "-f", "-qq", "-o", "/dev/null", "-e", "trace=write")
    done = _gpupool(
        new_args, work, strace=(*inject, "-e", f"inject=write:signal=SIGINT:when={last}")
    )
    assert done.returncode == 0, done.stderr
    assert "interrupted after writing" in done.stderr.splitlines()[-1], done.stderr
    assert _files(work, command) == new
