"""Root ``gpupool`` app: registers each area's commands and turns domain errors into one line."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from runtime import atomic_file
from runtime.cli import (
    advise_commands,
    alerts_commands,
    forge_commands,
    infra_commands,
    init_commands,
    kvcache_commands,
    policy_commands,
    snapshot_commands,
    trace_commands,
    tuner_commands,
    vllm_commands,
    whatif_commands,
)

app = typer.Typer(
    name="gpupool",
    help="Pool idle GPUs for low-priority LLM inference without hurting production.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
init_commands.register(app)
policy_commands.register(app)
infra_commands.register(app)
vllm_commands.register(app)
alerts_commands.register(app)
tuner_commands.register(app)
kvcache_commands.register(app)
snapshot_commands.register(app)
forge_commands.register(app)
whatif_commands.register(app)
advise_commands.register(app)
trace_commands.register(app)


INTERRUPTED = 130
"""Exit status of a command cut by SIGINT (typer's, the shell's 128 + 2)."""


def main() -> None:
    """Console-script entry point. An interrupt after the command's outputs are in place cut
    only its closing lines (the summary): the work is done, so it exits 0 and says so."""
    try:
        app(prog_name="gpupool")
    except SystemExit as exc:
        written = atomic_file.written()
        if exc.code != INTERRUPTED or not written:
            raise
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut this line
        print(f"interrupted after writing {_names(written)}: they are complete", file=sys.stderr)
        raise SystemExit(0) from None


def _names(paths: tuple[Path, ...], shown: int = 3) -> str:
    """``a, b, c and 4 more``: the outputs, briefly."""
    names = ", ".join(str(p) for p in paths[:shown])
    return names if len(paths) <= shown else f"{names} and {len(paths) - shown} more"


if __name__ == "__main__":
    main()
