"""Root ``gpupool`` app: registers each area's commands and turns domain errors into one line."""

from __future__ import annotations

import typer

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


def main() -> None:
    """Console-script entry point."""
    app(prog_name="gpupool")


if __name__ == "__main__":
    main()
