"""The control socket on its own: token check, bad requests, file mode, token files."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from runtime.kvcache.control import (
    ControlClient,
    ControlError,
    ControlServer,
    Op,
    Outcome,
    Status,
    read_token,
)


def echo(op: Op, args: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(op, Op)
    if op is Op.GROW:
        raise RuntimeError("handler failed")
    return {"op": op, "args": args}


@pytest.fixture
def server(tmp_path: Path) -> Any:
    running = ControlServer(tmp_path / "ctl" / "kv.sock", "s3cret", echo)
    yield running
    running.close()


def test_a_request_with_the_token_reaches_the_handler(server: ControlServer) -> None:
    reply = ControlClient(server.path, "s3cret").call(Op.STATUS, limit=3)
    assert reply == {"op": "status", "args": {"limit": 3}}
    assert (server.path.stat().st_mode & 0o777) == 0o600


def test_bad_token_bad_json_and_handler_errors_are_answered_not_fatal(
    server: ControlServer,
) -> None:
    with pytest.raises(ControlError, match="unauthorized"):
        ControlClient(server.path, "guess").call(Op.STATUS)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(server.path))
        raw.sendall(b"{not json\n")
        reply = json.loads(raw.makefile("rb").readline())
    assert reply["ok"] is False and "JSONDecodeError" in reply["error"]
    with pytest.raises(ControlError, match="handler failed"):
        ControlClient(server.path, "s3cret").call(Op.GROW)
    with pytest.raises(ControlError, match="unknown op 'defrag'; expected one of status, metrics"):
        ControlClient(server.path, "s3cret").call("defrag")  # type: ignore[arg-type]
    assert ControlClient(server.path, "s3cret").call(Op.METRICS)["op"] == "metrics"


def test_an_outcome_is_sent_as_json_with_its_status_as_the_plain_word() -> None:
    outcome = Outcome(Status.DEFERRED, "saturated", blocks_moved=3)
    reply = json.loads(json.dumps(outcome.to_reply()))
    assert reply["status"] == "deferred" and reply["blocks_moved"] == 3
    assert Op.COMPACT.changes_the_pool and not Op.STATUS.changes_the_pool


def test_token_files_and_missing_sockets_give_clear_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ControlError, match="is empty"):
        read_token(empty)
    with pytest.raises(ControlError, match="cannot read control token file"):
        read_token(tmp_path / "absent")
    with pytest.raises(ControlError, match="control socket"):
        ControlClient(tmp_path / "no.sock", "t").call(Op.STATUS)
