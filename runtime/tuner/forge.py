"""Edge: GitHub's REST API. Opens the tuner's pull requests (optional; the branch is the
output) and keeps the policy check's one comment on a pull request up to date.

The request builders are pure (tested offline): every one validates the repository, the
token and the API root and sends the same headers through ``_endpoint``. ``exchange`` is
the only code that touches the network; it turns every failure into one ``ForgeError``
line naming the call, the HTTP status and GitHub's message.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

TOKEN_ENV = "GITHUB_TOKEN"
"""Environment variable holding the token that may open pull requests and comment on them."""

API_URL_ENV = "GITHUB_API_URL"
"""Environment variable with the REST API root (GitHub Actions sets it; GitHub Enterprise
Server has its own)."""

DEFAULT_API_URL = "https://api.github.com"
"""The REST API root of github.com, used when ``GITHUB_API_URL`` is unset."""

API_VERSION = "2022-11-28"
"""``X-GitHub-Api-Version`` of every call."""

COMMENT_MARKER = "<!-- gpupool-whatif -->"
"""Hidden first line of the policy check's comment: the comment that starts with it is
updated instead of adding a new one on every push."""

MAX_COMMENT_CHARS = 65_535
"""Longest comment body sent: GitHub refuses bodies of 65,536 characters and more."""

COMMENTS_PER_PAGE = 100
"""``per_page`` of the comment listing (GitHub's maximum)."""

MAX_COMMENT_PAGES = 100
"""Pages of comments read while looking for the marked one (10,000 comments) at most."""

_REPOSITORY = re.compile(r"([\w.-]+)/([\w.-]+)", re.ASCII)
_LINK = re.compile(r"<([^>]*)>((?:\s*;\s*[^;,]*)*)")
_REL = re.compile(r"""rel\s*=\s*"?([^";]*)"?""")


class ForgeError(Exception):
    """A GitHub API call failed (refused, unreachable or answered nonsense); one line."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status GitHub answered; ``None`` when it was not reached."""


@dataclass(frozen=True)
class ApiCall:
    """One REST API request: method, URL, headers and JSON payload (``None``: no body)."""

    url: str
    headers: dict[str, str]
    payload: dict[str, str | bool] | None = None
    method: Literal["GET", "POST", "PATCH"] = "POST"


PullRequestCall = ApiCall
"""Everything one ``POST /repos/{owner}/{repo}/pulls`` needs (the name callers know)."""


@dataclass(frozen=True)
class Response:
    """What ``exchange`` read: the status, the decoded JSON and the ``Link`` header."""

    status: int
    data: object
    link: str | None = None


@dataclass(frozen=True)
class CommentResult:
    """What ``upsert_comment`` did."""

    action: Literal["created", "updated"]
    comment_id: int
    html_url: str


def api_url_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``$GITHUB_API_URL`` when set and not empty, else ``https://api.github.com``."""
    value = (os.environ if environ is None else environ).get(API_URL_ENV, "").strip()
    return value or DEFAULT_API_URL


def _api_root(api_url: str) -> str:
    parts = urllib.parse.urlsplit(api_url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f"expected the GitHub API URL as http(s)://HOST[/PATH] (${API_URL_ENV}, e.g. "
            f"{DEFAULT_API_URL}), found {api_url!r}"
        )
    return api_url.strip().rstrip("/")


def _endpoint(
    *, api_url: str, repository: str, token: str, option: str, may: str
) -> tuple[str, dict[str, str]]:
    """The repository's API root and the headers every call sends, after checking the
    repository (``option`` names where it came from), the token and the API URL."""
    match = _REPOSITORY.fullmatch(repository)
    if match is None or {match[1], match[2]} & {".", ".."}:
        raise ValueError(f"expected {option} as OWNER/NAME, found {repository!r}")
    if not token.strip():
        raise ValueError(f"{TOKEN_ENV} is empty: set it to a token that may {may}")
    headers = {
        "Accept": "application/vnd.github+json",
        "Authorization": f"Bearer {token.strip()}",
        "X-GitHub-Api-Version": API_VERSION,
        "Content-Type": "application/json",
        "User-Agent": "gpupool",
    }
    return f"{_api_root(api_url)}/repos/{match[1]}/{match[2]}", headers


def _pull_request_endpoint(
    *, api_url: str, repository: str, token: str
) -> tuple[str, dict[str, str]]:
    return _endpoint(
        api_url=api_url,
        repository=repository,
        token=token,
        option="--forge-repo",
        may="open pull requests",
    )


def check_pull_request_target(*, api_url: str, repository: str, token: str) -> None:
    """Raise ``ValueError`` (one line) unless pull requests could be opened with these (the
    same checks ``build_pull_request`` makes), so a command fails before any side effect."""
    _pull_request_endpoint(api_url=api_url, repository=repository, token=token)


def build_pull_request(
    *, api_url: str, repository: str, token: str, title: str, body: str, head: str, base: str
) -> PullRequestCall:
    """The request GitHub documents for creating a pull request (pure; tested offline)."""
    root, headers = _pull_request_endpoint(api_url=api_url, repository=repository, token=token)
    return ApiCall(
        url=f"{root}/pulls",
        headers=headers,
        payload={"title": title, "body": body, "head": head, "base": base, "draft": False},
    )


def raw_file_url(*, api_url: str, repository: str, ref: str, path: str) -> str:
    """Where a pull request's body can show ``path`` as committed on ``ref``: the web
    host's ``/OWNER/NAME/raw/REF/PATH`` (github.com for ``api.github.com``, the host itself
    for GitHub Enterprise Server's ``https://HOST/api/v3``). It serves private repositories
    to the readers who may see them, which the bare raw-content host does not."""
    root = urllib.parse.urlsplit(_api_root(api_url))
    match = _REPOSITORY.fullmatch(repository)
    if match is None or {match[1], match[2]} & {".", ".."}:
        raise ValueError(f"expected --forge-repo as OWNER/NAME, found {repository!r}")
    host = "github.com" if root.netloc == "api.github.com" else root.netloc
    prefix = root.path.removesuffix("/api/v3")
    where = urllib.parse.quote(f"{ref}/{path}", safe="/")
    return f"{root.scheme}://{host}{prefix}/{match[1]}/{match[2]}/raw/{where}"


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected {what} as a positive integer, found {value!r}")
    return value


def _comment_endpoint(*, api_url: str, repository: str, token: str) -> tuple[str, dict[str, str]]:
    return _endpoint(
        api_url=api_url,
        repository=repository,
        token=token,
        option="--repo",
        may="comment on pull requests (pull-requests: write)",
    )


def check_marker(marker: str) -> str:
    """``marker`` when it is one hidden HTML comment on one line, such as the default."""
    inner = marker[4:-3]
    if (
        not marker.startswith("<!--")
        or not marker.endswith("-->")
        or not inner.strip()
        or "--" in inner
        or any(c in inner for c in "<>\r\n")
    ):
        raise ValueError(
            f"expected the marker as one HTML comment like {COMMENT_MARKER}, found {marker!r}"
        )
    return marker


def comment_body(body: str, *, marker: str = COMMENT_MARKER) -> str:
    """The body as sent: ``marker`` on its first line (added when missing); refused when
    GitHub would refuse it (``MAX_COMMENT_CHARS``)."""
    check_marker(marker)
    text = body if body.startswith(marker) else f"{marker}\n{body}"
    if len(text) > MAX_COMMENT_CHARS:
        raise ValueError(
            f"comment body has {len(text):,} characters (with the marker line); GitHub accepts "
            f"at most {MAX_COMMENT_CHARS:,}: shorten it or link to the full report"
        )
    return text


def build_comment_list(*, api_url: str, repository: str, token: str, number: int) -> ApiCall:
    """``GET /repos/{o}/{r}/issues/{n}/comments?per_page=100``: the first page of comments
    of pull request ``number`` (pull requests are issues to this API)."""
    root, headers = _comment_endpoint(api_url=api_url, repository=repository, token=token)
    n = _positive(number, "the pull request number")
    return ApiCall(
        url=f"{root}/issues/{n}/comments?per_page={COMMENTS_PER_PAGE}",
        headers=headers,
        payload=None,
        method="GET",
    )


def build_next_page(call: ApiCall, url: str) -> ApiCall:
    """The same listing at ``url`` (a ``Link: rel="next"`` target). Refused unless it is on
    the host of ``call``: the token goes only where the API is."""
    here, there = urllib.parse.urlsplit(call.url), urllib.parse.urlsplit(url)
    if (there.scheme, there.netloc) != (here.scheme, here.netloc):
        raise ForgeError(
            f"GitHub API: refusing to follow a next-page link off {here.scheme}://{here.netloc}: "
            f"{url!r}"
        )
    return ApiCall(url=url, headers=call.headers, payload=None, method="GET")


def build_comment_create(
    *, api_url: str, repository: str, token: str, number: int, body: str
) -> ApiCall:
    """``POST /repos/{o}/{r}/issues/{n}/comments`` with ``body`` (already ``comment_body``)."""
    root, headers = _comment_endpoint(api_url=api_url, repository=repository, token=token)
    n = _positive(number, "the pull request number")
    return ApiCall(
        url=f"{root}/issues/{n}/comments",
        headers=headers,
        payload={"body": _within_limit(body)},
        method="POST",
    )


def build_comment_update(
    *, api_url: str, repository: str, token: str, comment_id: int, body: str
) -> ApiCall:
    """``PATCH /repos/{o}/{r}/issues/comments/{id}`` replacing that comment's body."""
    root, headers = _comment_endpoint(api_url=api_url, repository=repository, token=token)
    cid = _positive(comment_id, "the comment id")
    return ApiCall(
        url=f"{root}/issues/comments/{cid}",
        headers=headers,
        payload={"body": _within_limit(body)},
        method="PATCH",
    )


def _within_limit(body: str) -> str:
    if len(body) > MAX_COMMENT_CHARS:
        raise ValueError(
            f"comment body has {len(body):,} characters; GitHub accepts at most "
            f"{MAX_COMMENT_CHARS:,}"
        )
    return body


def next_page_url(link: str | None) -> str | None:
    """The ``rel="next"`` target of a ``Link`` header (RFC 8288), ``None`` on the last page."""
    for match in _LINK.finditer(link or ""):
        for param in match[2].split(";"):
            rel = _REL.fullmatch(param.strip())
            if rel is not None and "next" in rel[1].lower().split():
                return match[1].strip()
    return None


def marked_comment_id(comments: object, *, marker: str = COMMENT_MARKER) -> int | None:
    """Id of the first comment of one listing page whose body starts with ``marker``.

    Comments that merely quote the marker further down are not ours and are left alone.
    """
    if not isinstance(comments, list):
        raise ForgeError(
            f"GitHub API: expected a list of comments, found {type(comments).__name__}"
        )
    for comment in comments:
        if not isinstance(comment, dict):
            raise ForgeError("GitHub API: a listed comment is not a JSON object")
        body = comment.get("body")
        if isinstance(body, str) and body.lstrip().startswith(marker):
            cid = comment.get("id")
            if isinstance(cid, bool) or not isinstance(cid, int):
                raise ForgeError(f"GitHub API: the marked comment has no integer id: {cid!r}")
            return cid
    return None


def _one_line(text: str, limit: int = 500) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _error_line(call: ApiCall, status: int, reason: str, raw: bytes) -> str:
    """``GitHub API: METHOD URL: 403 Forbidden: <message> (<errors>)`` from GitHub's error
    document (``message``, optional ``errors``) or the start of a body that is not one."""
    where = f"GitHub API: {call.method} {call.url.split('?')[0]}: {status} {reason}".rstrip()
    text = raw.decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("message"), str):
        message = document["message"]
        details = [
            e.get("message") or e.get("code")
            for e in document.get("errors") or ()
            if isinstance(e, dict) and (e.get("message") or e.get("code"))
        ]
        if details:
            message += f" ({'; '.join(str(d) for d in details)})"
    else:
        message = text
    return _one_line(f"{where}: {message}" if message.strip() else where)


def exchange(call: ApiCall, *, timeout_s: float = 30) -> Response:
    """Send ``call``; its JSON answer, or ``ForgeError`` (one line) on any failure."""
    data = None if call.payload is None else json.dumps(call.payload).encode()
    request = urllib.request.Request(call.url, data=data, headers=call.headers, method=call.method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, link, raw = int(response.status), response.headers.get("Link"), response.read()
    except urllib.error.HTTPError as exc:
        raise ForgeError(
            _error_line(call, exc.code, exc.reason or "", exc.read()), status=exc.code
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        reason = str(reason) or type(reason).__name__
        raise ForgeError(
            _one_line(f"GitHub API: {call.method} {call.url.split('?')[0]}: unreachable: {reason}")
        ) from None
    try:
        decoded = json.loads(raw) if raw.strip() else None
    except ValueError:
        raise ForgeError(
            _one_line(
                f"GitHub API: {call.method} {call.url.split('?')[0]}: {status} with a body that "
                f"is not JSON: {raw[:120].decode('utf-8', 'replace')}"
            ),
            status=status,
        ) from None
    return Response(status=status, data=decoded, link=link)


def _html_url(call: ApiCall, response: Response) -> str:
    if not isinstance(response.data, dict) or not isinstance(response.data.get("html_url"), str):
        raise ForgeError(
            f"GitHub API: {call.method} {call.url.split('?')[0]}: {response.status} without an "
            "html_url in the answer",
            status=response.status,
        )
    return str(response.data["html_url"])


def send(call: PullRequestCall, *, timeout_s: float = 30) -> str:
    """Send the call (the tuner's ``POST .../pulls``); returns the answer's ``html_url``."""
    return _html_url(call, exchange(call, timeout_s=timeout_s))


def find_marked_comment(
    listing: ApiCall, *, marker: str = COMMENT_MARKER, timeout_s: float = 30
) -> int | None:
    """Walk the listing's pages (``Link: rel="next"``) until a comment starts with
    ``marker``; its id, or ``None`` when no page has one."""
    call, seen = listing, set()
    for _ in range(MAX_COMMENT_PAGES):
        seen.add(call.url)
        response = exchange(call, timeout_s=timeout_s)
        found = marked_comment_id(response.data, marker=marker)
        if found is not None:
            return found
        url = next_page_url(response.link)
        if url is None or url in seen:
            return None
        call = build_next_page(listing, url)
    raise ForgeError(
        f"GitHub API: more than {MAX_COMMENT_PAGES} pages of comments; not looking further"
    )


def upsert_comment(
    *,
    api_url: str,
    repository: str,
    token: str,
    number: int,
    body: str,
    marker: str = COMMENT_MARKER,
    timeout_s: float = 30,
) -> CommentResult:
    """Create or update the one comment of pull request ``number`` that starts with
    ``marker``: list the comments (every page), PATCH the marked one, else POST a new one.

    Everything is validated (repository, token, URL, body length) before the first request.
    """
    text = comment_body(body, marker=marker)
    listing = build_comment_list(api_url=api_url, repository=repository, token=token, number=number)
    try:
        existing = find_marked_comment(listing, marker=marker, timeout_s=timeout_s)
        if existing is None:
            call = build_comment_create(
                api_url=api_url, repository=repository, token=token, number=number, body=text
            )
        else:
            call = build_comment_update(
                api_url=api_url, repository=repository, token=token, comment_id=existing, body=text
            )
        response = exchange(call, timeout_s=timeout_s)
    except ForgeError as exc:
        hint = _HINTS.get(exc.status or 0)
        if hint is None:
            raise
        raise ForgeError(
            f"{exc} ({hint.format(repository=repository, number=number)})", status=exc.status
        ) from None
    cid = response.data.get("id") if isinstance(response.data, dict) else None
    if isinstance(cid, bool) or not isinstance(cid, int):
        cid = existing
    if cid is None:
        raise ForgeError(f"GitHub API: {call.method} {call.url}: no comment id in the answer")
    return CommentResult(
        action="created" if existing is None else "updated",
        comment_id=cid,
        html_url=_html_url(call, response),
    )


_HINTS = {
    401: f"is {TOKEN_ENV} a valid token?",
    403: f"does {TOKEN_ENV} grant pull-requests: write on {{repository}}? pull requests from "
    "forks get a read-only token",
    404: f"is #{{number}} a pull request of {{repository}} that {TOKEN_ENV} can see?",
}
"""What to check when a comment call is refused with this status."""
