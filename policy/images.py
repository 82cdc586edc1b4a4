"""Container image references: validated like the container runtime parses them, and the
supply-chain warning for references that are not pinned by digest."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
_REFERENCE = re.compile(
    rf"(?P<name>{_NAME})(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}))?(?:@(?P<digest>.+))?",
    re.ASCII | re.DOTALL,
)
"""The grammar of ``distribution/reference`` (what the kubelet hands the runtime):
``[host[:port]/]path[:tag][@digest]``, matched whole and ASCII-only (a tag's ``\\w`` is
``[A-Za-z0-9_]`` there, not every script's letters); the digest is checked on its own below."""

NAME_TOTAL_MAX = 255
"""Longest repository name (host and path) ``distribution/reference`` accepts."""

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
"""The only digest gpupool accepts: ``sha256:`` and 64 lower-case hex digits (OCI)."""


def _check_image(value: str) -> str:
    match = _REFERENCE.fullmatch(value)
    if match is None:
        raise ValueError(
            "expected an image reference [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST] (ASCII: "
            "lower-case repository, tag of letters, digits, '_', '.', '-'), e.g. "
            f"vllm/vllm-openai:v0.32.0, found {value!r}"
        )
    if len(match["name"]) > NAME_TOTAL_MAX:
        raise ValueError(
            f"expected a repository name of at most {NAME_TOTAL_MAX} characters, found "
            f"{len(match['name'])} in {value!r}"
        )
    digest = match["digest"]
    if digest is not None and not _DIGEST.fullmatch(digest):
        raise ValueError(
            f"expected the digest after '@' to be sha256: and 64 lower-case hex digits, "
            f"found {digest!r} in {value!r}"
        )
    return value


ImageReference = Annotated[str, AfterValidator(_check_image)]
"""A container image: ``repository:tag``, or pinned ``repository[:tag]@sha256:<64 hex>``."""


def pinned(image: str) -> bool:
    """Whether ``image`` names its content by digest (a tag can be moved to other content)."""
    return "@" in image
