"""Edge: the tuner's memory between cycles, one JSON file written atomically."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from runtime.atomic_file import write_atomic
from runtime.tuner.proposals import TunerState


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
    write_atomic(path, json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")
