"""Edge: read a file a user names (policy, trace, model config) within stated limits.

A path can name ``/dev/zero``, a FIFO or a gzip bomb as easily as a file: each would be
read until memory or patience runs out. Every reader of user files goes through here, so
one place refuses what is not a regular file (by ``stat`` before opening: opening a FIFO
blocks), caps the bytes read (after decompression for ``.gz``) and the length of a line.
The limits and why they are what they are: docs/design/limits.md.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

MIB: Final = 1024 * 1024

POLICY_BYTES: Final = 16 * MIB
"""Largest policy file: ten pools each listing 5,000 nodes (the most a Kubernetes cluster
supports) take about 1.5 MiB, 150,000 node names about 4 MiB."""

MODEL_CONFIG_BYTES: Final = 4 * MIB
"""Largest model ``config.json``: published ones are a few KiB, those with label maps a few
hundred."""

TRACE_BYTES: Final = 1024 * MIB
"""Most bytes a trace may hold once inflated: over 200 times the largest bundled trace
(4.6 MiB), and about what a replay capped at ``MAX_REPLAY_REQUESTS`` can use."""

TRACE_LINE_BYTES: Final = 1 * MIB
"""Longest line of a trace: a Mooncake row of a 128k-token prompt is about 2 KiB."""


class FileRefused(ValueError):
    """A file refused before or while reading; ``line`` is where, when there is one.

    The message says what was expected and found, without the file name: callers put it in
    their own one-line errors, which name the file."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(message)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: Path, limit: int) -> BinaryIO:
    """``path`` opened for reading after ``stat`` shows a regular file of at most ``limit``
    bytes (checked again on the open file, which a rename may have swapped)."""
    before = path.stat()
    if not stat.S_ISREG(before.st_mode):
        raise FileRefused(f"expected a regular file, found {_kind(before.st_mode)}")
    handle = path.open("rb")
    after = os.fstat(handle.fileno())
    if not stat.S_ISREG(after.st_mode):
        handle.close()
        raise FileRefused(f"expected a regular file, found {_kind(after.st_mode)}")
    if after.st_size > limit:
        handle.close()
        _too_big(limit, after.st_size)
    return handle


def _too_big(limit: int, found: int | None) -> None:
    size = "more" if found is None else f"{found / MIB:.1f} MiB"
    raise FileRefused(f"expected at most {limit / MIB:g} MiB, found {size}")


def read_bytes(path: Path, limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes."""
    with _open_regular(path, limit) as handle:
        data = handle.read(limit + 1)  # a file growing while read is refused too
    if len(data) > limit:
        _too_big(limit, None)
    return data


def read_text(path: Path, limit: int) -> str:
    """``read_bytes`` as UTF-8 text; a byte that is not UTF-8 is refused with its line."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileRefused(f"expected UTF-8 text: {exc.reason}", line) from None


def read_lines(path: Path, limit: int, line_limit: int) -> Iterator[str]:
    """The lines of a text file without line endings, one at a time (``.gz`` inflated by
    suffix): at most ``limit`` bytes in all once inflated, at most ``line_limit`` a line.
    A UTF-8 byte-order mark at the start is dropped."""
    # the packed file may not exceed the cap either: gzip makes text smaller, never larger
    with _open_regular(path, limit) as raw:
        stream: BinaryIO | gzip.GzipFile = raw
        if path.suffix == ".gz":
            stream = gzip.GzipFile(fileobj=raw)
        total = 0
        number = 0
        try:
            while chunk := stream.readline(line_limit + 2):
                number += 1
                total += len(chunk)
                if total > limit:
                    _too_big(limit, None)
                body = chunk.removesuffix(b"\n").removesuffix(b"\r")
                if len(body) > line_limit:
                    raise FileRefused(
                        f"expected lines of at most {line_limit / MIB:g} MiB, found a longer one",
                        number,
                    )
                try:
                    text = body.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise FileRefused(f"expected UTF-8 text: {exc.reason}", number) from None
                yield text
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise FileRefused(f"expected gzip data: {exc}", number + 1) from None
