"""Edge: the tuner's memory between cycles, one JSON file written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from runtime.tuner.decisions import TunerState


def load_state(path: Path) -> TunerState:
    """The saved state, or a fresh one if none was saved; a corrupt file is an error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return TunerState()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{path}: corrupt tuner state ({exc}); delete it to start afresh"
        ) from None
    try:
        return TunerState(**data)
    except TypeError as exc:
        raise ValueError(f"{path}: unexpected tuner state fields ({exc})") from None


def save_state(path: Path, state: TunerState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write a temp file beside ``path`` and rename it over: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
