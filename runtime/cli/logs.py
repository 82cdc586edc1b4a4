"""The long-running commands' log lines: one format, on stderr, at the level each command asks."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: int) -> None:
    """Send log records at ``level`` and above to stderr as ``time level logger: message``."""
    logging.basicConfig(level=level, format=LOG_FORMAT)
