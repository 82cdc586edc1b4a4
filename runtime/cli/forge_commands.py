"""``pr-comment``: create or update the policy check's one comment on a GitHub pull request."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from runtime.cli.errors import UsageProblem, reported_errors
from runtime.tuner import forge


def pr_comment(
    repo: Annotated[str, typer.Option(help="OWNER/NAME of the GitHub repository.")],
    pr: Annotated[int, typer.Option(help="Number of the pull request.", min=1)],
    body_file: Annotated[
        Path, typer.Option(help="Markdown file with the comment (UTF-8, under 65,536 characters).")
    ],
    api_url: Annotated[
        str,
        typer.Option(
            envvar=forge.API_URL_ENV,
            show_envvar=True,
            help="GitHub REST API root (GitHub Enterprise Server: https://HOST/api/v3).",
        ),
    ] = forge.DEFAULT_API_URL,
    marker: Annotated[
        str,
        typer.Option(
            help="Hidden first line that identifies the comment to update (one per policy)."
        ),
    ] = forge.COMMENT_MARKER,
) -> None:
    """Post the body as the pull request's comment, or update the one posted before.

    The comment starting with --marker is updated in place (PATCH); without one a new
    comment is added (POST). Token: $GITHUB_TOKEN (pull-requests: write).
    """
    with reported_errors():
        try:
            body = body_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageProblem(f"--body-file {body_file}: {exc}") from None
        try:
            result = forge.upsert_comment(
                api_url=api_url,
                repository=repo,
                token=os.environ.get(forge.TOKEN_ENV, ""),
                number=pr,
                body=body,
                marker=marker,
            )
        except (ValueError, forge.ForgeError) as exc:
            raise UsageProblem(str(exc)) from None
    typer.echo(f"{result.action} {result.html_url}")


def register(app: typer.Typer) -> None:
    app.command("pr-comment")(pr_comment)
