"""The CLI's two consoles: results on stdout, one-line errors on stderr.

``soft_wrap``: a line is never cut at the console's width (80 columns when stdout is a pipe
or a CI log), so paths and counts stay on one line; tables fold or become markdown on their
own (``tables.print_table``).
"""

from __future__ import annotations

from rich.console import Console

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
