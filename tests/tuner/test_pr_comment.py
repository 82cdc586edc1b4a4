"""The policy check's pull-request comment: ``forge``'s comment builders and edge,
``gpupool pr-comment``, ``infra/ci/policy-check.sh`` and the GitHub Actions workflow.

The API tests run against a local HTTP server (``tests.harness.github``, the ``github``
fixture) that replays GitHub responses recorded in ``fixtures/github/`` and records every
request it receives.

Most script tests run the script with ``GPUPOOL_WHATIF`` pointing at a small stand-in that
writes a markdown report (with its own marker line, as the real one does) and a plot, so they
check the script's plumbing in a second; one runs it end to end with the real ``gpupool
whatif`` (a short replay of the bundled traces).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from runtime.cli.app import app
from runtime.tuner import forge
from tests.harness.github import ReplayGitHub
from tests.harness.servers import REPO

SCRIPT = REPO / "infra" / "ci" / "policy-check.sh"
WORKFLOW = REPO / "infra" / "ci" / "github-policy-check.yaml"
REPOSITORY = "acme/gpupool-policy"
TOKEN = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
MARKED_ID = 2412399012  # the marked comment of list_comments_page2_marked.json
CREATED_ID = 2412467790  # the comment of create_comment.json


# --- (a) pure builders -----------------------------------------------------------------


def test_comment_calls_follow_the_rest_api() -> None:
    common = {"api_url": "https://ghe.example.com/api/v3/", "repository": REPOSITORY}
    listing = forge.build_comment_list(**common, token="t0k", number=42)
    assert listing.method == "GET" and listing.payload is None
    assert listing.url == (
        "https://ghe.example.com/api/v3/repos/acme/gpupool-policy/issues/42/comments?per_page=100"
    )
    assert listing.headers == {
        "Accept": "application/vnd.github+json",
        "Authorization": "Bearer t0k",
        "X-GitHub-Api-Version": "2022-11-28",
        "Content-Type": "application/json",
        "User-Agent": "gpupool",
    }
    create = forge.build_comment_create(**common, token="t0k", number=42, body="hello")
    assert create.method == "POST"
    assert (
        create.url == "https://ghe.example.com/api/v3/repos/acme/gpupool-policy/issues/42/comments"
    )
    assert create.payload == {"body": "hello"}
    update = forge.build_comment_update(**common, token="t0k", comment_id=7, body="again")
    assert update.method == "PATCH"
    assert (
        update.url == "https://ghe.example.com/api/v3/repos/acme/gpupool-policy/issues/comments/7"
    )
    assert update.payload == {"body": "again"}
    # one header set for every call, the pull request's included
    pull = forge.build_pull_request(
        **common, token="t0k", title="T", body="B", head="h", base="main"
    )
    assert pull.headers == listing.headers == create.headers == update.headers
    assert pull.method == "POST" and pull.url.endswith("/repos/acme/gpupool-policy/pulls")


def test_api_url_comes_from_the_environment() -> None:
    assert forge.api_url_from_env({}) == "https://api.github.com"
    assert forge.api_url_from_env({"GITHUB_API_URL": " "}) == "https://api.github.com"
    assert forge.api_url_from_env({"GITHUB_API_URL": "https://h/api/v3"}) == "https://h/api/v3"


def test_next_page_comes_from_the_link_header() -> None:
    page = "https://api.github.com/repositories/1/issues/42/comments?per_page=100&page="
    link = f'<{page}1>; rel="prev", <{page}3>; rel="next", <{page}5>; rel="last"'
    assert forge.next_page_url(link) == f"{page}3"
    assert forge.next_page_url('<https://x/a?page=2>; title="n"; rel="next prefetch"') == (
        "https://x/a?page=2"
    )
    assert forge.next_page_url('<https://x/a?page=1>; rel="prev"') is None
    assert forge.next_page_url("") is None
    assert forge.next_page_url(None) is None


def test_next_page_stays_on_the_api_host() -> None:
    listing = forge.build_comment_list(
        api_url="https://api.github.com", repository=REPOSITORY, token="t", number=1
    )
    page = forge.build_next_page(listing, "https://api.github.com/repositories/9/issues/1/c?page=2")
    assert page.method == "GET" and page.headers == listing.headers
    with pytest.raises(forge.ForgeError, match="refusing to follow"):
        forge.build_next_page(listing, "https://evil.example.com/steal?page=2")
    with pytest.raises(forge.ForgeError, match="refusing to follow"):
        forge.build_next_page(listing, "http://api.github.com/repositories/9/issues/1/c?page=2")


def test_the_marked_comment_is_the_one_that_starts_with_the_marker() -> None:
    marker = forge.COMMENT_MARKER
    comments = [
        {"id": 1, "body": "lgtm"},
        {"id": 2, "body": f"the bot's comment starts with {marker}"},
        {"id": 3, "body": f"{marker}\n## report"},
        {"id": 4, "body": f"{marker}\nolder duplicate"},
    ]
    assert forge.marked_comment_id(comments) == 3
    assert forge.marked_comment_id(comments[:2]) is None
    assert forge.marked_comment_id([{"id": 5, "body": "<!-- other -->\n"}]) is None
    assert forge.marked_comment_id([{"id": 5, "body": "<!-- other -->"}], marker="<!-- other -->")
    with pytest.raises(forge.ForgeError, match="list of comments"):
        forge.marked_comment_id({"message": "Not Found"})


def test_body_carries_the_marker_and_stays_under_the_limit() -> None:
    assert forge.comment_body("report") == "<!-- gpupool-whatif -->\nreport"
    assert forge.comment_body("<!-- gpupool-whatif -->\nx") == "<!-- gpupool-whatif -->\nx"
    limit = forge.MAX_COMMENT_CHARS
    assert limit == 65_535
    fits = "x" * (limit - len(forge.COMMENT_MARKER) - 1)
    assert len(forge.comment_body(fits)) == limit
    with pytest.raises(ValueError, match=r"65,536 characters .*at most 65,535"):
        forge.comment_body(fits + "x")
    with pytest.raises(ValueError, match="at most 65,535"):
        forge.build_comment_create(
            api_url="https://api.github.com",
            repository=REPOSITORY,
            token="t",
            number=1,
            body="é" * (limit + 1),
        )
    with pytest.raises(ValueError, match="one HTML comment"):
        forge.comment_body("x", marker="gpupool-whatif")
    with pytest.raises(ValueError, match="one HTML comment"):
        forge.comment_body("x", marker="<!-- a -- b -->")


@pytest.mark.parametrize(
    "repository", ["acme", "acme/", "/policy", "a/b/c", "a/..", "../b", "a/b?x=1", "a b/c", ""]
)
def test_bad_repository_is_refused(repository: str) -> None:
    with pytest.raises(ValueError, match="--repo as OWNER/NAME"):
        forge.build_comment_list(
            api_url="https://api.github.com", repository=repository, token="t", number=1
        )


def test_bad_token_number_or_url_is_refused() -> None:
    common = {"repository": REPOSITORY, "api_url": "https://api.github.com"}
    with pytest.raises(ValueError, match=r"GITHUB_TOKEN is empty.*pull-requests: write"):
        forge.build_comment_list(**common, token=" ", number=1)
    for number in (0, -3, True):
        with pytest.raises(ValueError, match="pull request number as a positive integer"):
            forge.build_comment_list(**common, token="t", number=number)
    with pytest.raises(ValueError, match="comment id as a positive integer"):
        forge.build_comment_update(**common, token="t", comment_id=0, body="x")
    for url in ("api.github.com", "ftp://api.github.com", "https://", "https://h/?q=1"):
        with pytest.raises(ValueError, match="http"):
            forge.build_comment_list(repository=REPOSITORY, api_url=url, token="t", number=1)


# --- (b) recorded API exchanges ----------------------------------------------------------


def _upsert(github: ReplayGitHub, body: str = "## report\n") -> forge.CommentResult:
    return forge.upsert_comment(
        api_url=github.url, repository=REPOSITORY, token=TOKEN, number=42, body=body
    )


def test_first_run_posts_a_new_comment(github: ReplayGitHub) -> None:
    github.load("list_comments_unmarked.json", "create_comment.json")
    result = _upsert(github)
    assert github.calls() == [
        "GET /repos/acme/gpupool-policy/issues/42/comments?per_page=100",
        "POST /repos/acme/gpupool-policy/issues/42/comments",
    ]
    assert result == forge.CommentResult(
        action="created",
        comment_id=CREATED_ID,
        html_url=f"https://github.com/acme/gpupool-policy/pull/42#issuecomment-{CREATED_ID}",
    )
    assert github.received[1].body == {"body": "<!-- gpupool-whatif -->\n## report\n"}
    for request in github.received:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["accept"] == "application/vnd.github+json"


def test_later_run_updates_the_marked_comment_found_on_page_two(github: ReplayGitHub) -> None:
    github.load(
        "list_comments_page1_next.json", "list_comments_page2_marked.json", "update_comment.json"
    )
    result = _upsert(github, "<!-- gpupool-whatif -->\n## new report\n")
    assert github.calls() == [
        "GET /repos/acme/gpupool-policy/issues/42/comments?per_page=100",
        "GET /repositories/771234567/issues/42/comments?per_page=100&page=2",
        f"PATCH /repos/acme/gpupool-policy/issues/comments/{MARKED_ID}",
    ]
    assert github.received[2].body == {"body": "<!-- gpupool-whatif -->\n## new report\n"}
    assert result.action == "updated" and result.comment_id == MARKED_ID
    assert result.html_url.endswith(f"#issuecomment-{MARKED_ID}")
    for request in github.received:  # the next page too: same host, same headers
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.headers["x-github-api-version"] == "2022-11-28"


def test_refusal_is_one_line_with_status_and_message(github: ReplayGitHub) -> None:
    github.load("list_comments_unmarked.json", "forbidden.json")
    with pytest.raises(forge.ForgeError) as caught:
        _upsert(github)
    line = str(caught.value)
    assert "\n" not in line and caught.value.status == 403
    assert line.startswith(
        f"GitHub API: POST {github.url}/repos/acme/gpupool-policy/issues/42/comments: "
        "403 Forbidden: Resource not accessible by integration"
    )
    assert "pull-requests: write" in line and TOKEN not in line


def test_unknown_pull_request_and_dead_server_are_one_line(github: ReplayGitHub) -> None:
    github.load()  # nothing recorded: GitHub's 404
    with pytest.raises(forge.ForgeError, match=r"404 Not Found: Not Found \(is #42 a pull") as err:
        _upsert(github)
    assert "\n" not in str(err.value)
    with pytest.raises(forge.ForgeError, match="unreachable") as err:
        forge.upsert_comment(
            api_url="http://127.0.0.1:9", repository=REPOSITORY, token=TOKEN, number=1, body="x"
        )
    assert "\n" not in str(err.value)


def test_nothing_is_sent_for_a_body_over_the_limit(github: ReplayGitHub) -> None:
    github.load("list_comments_unmarked.json", "create_comment.json")
    with pytest.raises(ValueError, match="at most 65,535"):
        _upsert(github, "x" * 70_000)
    assert github.received == []


# --- (c) the CLI -------------------------------------------------------------------------


def _cli(github: ReplayGitHub, body_file: Path, *extra: str, token: str = TOKEN) -> Result:
    return CliRunner().invoke(
        app,
        ["pr-comment", "--repo", REPOSITORY, "--pr", "42", "--body-file", str(body_file), *extra],
        env={"GITHUB_TOKEN": token, "GITHUB_API_URL": github.url},
    )


def test_cli_creates_then_updates(github: ReplayGitHub, tmp_path: Path) -> None:
    body = tmp_path / "comment.md"
    body.write_text("## report\n", encoding="utf-8")
    github.load("list_comments_unmarked.json", "create_comment.json")
    result = _cli(github, body)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"created https://github.com/acme/gpupool-policy/pull/42#issuecomment-{CREATED_ID}\n"
    )
    github.load(
        "list_comments_page1_next.json", "list_comments_page2_marked.json", "update_comment.json"
    )
    result = _cli(github, body, "--api-url", github.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("updated https://github.com/")
    assert github.calls()[-1] == f"PATCH /repos/acme/gpupool-policy/issues/comments/{MARKED_ID}"


def test_cli_errors_are_one_line(github: ReplayGitHub, tmp_path: Path) -> None:
    body = tmp_path / "comment.md"
    body.write_text("## report\n", encoding="utf-8")
    github.load("list_comments_unmarked.json", "forbidden.json")
    result = _cli(github, body)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: GitHub API: POST ")
    assert "403 Forbidden: Resource not accessible by integration" in lines[0]

    github.load()
    for args, token, expected in [
        ((), "", "GITHUB_TOKEN is empty"),
        (("--repo", "acme"), TOKEN, "--repo as OWNER/NAME"),
        (("--body-file", str(tmp_path / "missing.md")), TOKEN, "--body-file"),
    ]:
        result = _cli(github, body, *args, token=token)  # a repeated option: the last wins
        assert result.exit_code == 1, result.output
        assert len(result.stderr.splitlines()) == 1 and expected in result.stderr
    assert github.received == []  # validated before any request

    body.write_text("x" * 65_536, encoding="utf-8")
    result = _cli(github, body)
    assert result.exit_code == 1
    assert "GitHub accepts at most 65,535" in result.stderr


# --- (d) the policy-check script ----------------------------------------------------------

STAND_IN = """#!/bin/sh
# stand-in for: gpupool whatif --base REF --head REF --markdown OUT --plots DIR
set -eu
printf '%s\\n' "$*" >>"$WHATIF_CALLS"
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2 ;; --head) head=$2 ;; --markdown) md=$2 ;; --plots) plots=$2 ;;
    --policy-path) policy=$2 ;;
    *) echo "stand-in: unexpected $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$plots" "$(dirname "$md")"
printf '<svg xmlns="http://www.w3.org/2000/svg"/>\\n' >"$plots/utilization.svg"
{
  printf '<!-- gpupool-whatif -->\\n### What-if replay (stand-in)\\n\\n'
  printf 'base %s, head %s, policy %s\\n\\n' "$base" "$head" "$policy"
  printf '![utilization](utilization.svg)\\n'
  if [ -n "${WHATIF_PAD:-}" ]; then head -c "$WHATIF_PAD" /dev/zero | tr '\\0' 'w'; echo; fi
} >"$md"
"""

ADVISE_STAND_IN = """#!/bin/sh
# stand-in for: gpupool advise --policy FILE [--prod-trace FILE] --out DIR
set -eu
printf '%s\\n' "$*" >>"$ADVISE_CALLS"
while [ $# -gt 0 ]; do
  case "$1" in
    --policy) policy=$2 ;; --out) out=$2 ;; --prod-trace) test -f "$2" ;;
    *) echo "stand-in: unexpected $1" >&2; exit 2 ;;
  esac
  shift 2
done
test -f "$policy"
mkdir -p "$out"
printf '## gpupool advise\\n\\nFront: stand-in verdict\\n' >"$out/advise.md"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit_policy(repo: Path, old: str, new: str) -> str:
    policy = repo / "policy" / "pool.yaml"
    text = policy.read_text(encoding="utf-8")
    assert old in text
    policy.write_text(text.replace(old, new), encoding="utf-8")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qam", new)
    return _git(repo, "rev-parse", "HEAD")


@dataclass(frozen=True)
class ScriptRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path


def _run_script(
    repo: Path, tmp_path: Path, github: ReplayGitHub, **env: str
) -> tuple[ScriptRun, list[str]]:
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "gpupool").exists(), f"gpupool is not installed beside {sys.executable}"
    stand_in = tmp_path / "whatif-stand-in"
    stand_in.write_text(STAND_IN, encoding="utf-8")
    stand_in.chmod(0o755)
    advise = tmp_path / "advise-stand-in"
    advise.write_text(ADVISE_STAND_IN, encoding="utf-8")
    advise.chmod(0o755)
    calls = tmp_path / "whatif-calls.txt"
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "GPUPOOL", "PR_", "RUN_URL", "WHATIF_"))
        and k not in {"BASE_REF", "HEAD_REF", "POLICY", "OUT_DIR", "COMMENT_MARKER"}
    }
    full_env = {
        **clean,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPUPOOL_WHATIF": str(stand_in),
        "GPUPOOL_ADVISE": str(advise),
        "ADVISE_CALLS": str(tmp_path / "advise-calls.txt"),
        "WHATIF_CALLS": str(calls),
        "GITHUB_API_URL": github.url,
        **env,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT)], cwd=repo, env=full_env, capture_output=True, text=True, timeout=300
    )
    whatif_calls = calls.read_text().splitlines() if calls.exists() else []
    return ScriptRun(
        done.returncode, done.stdout, done.stderr, repo / "build" / "whatif"
    ), whatif_calls


def _posting(base: str, head: str) -> dict[str, str]:
    return {
        "BASE_REF": base,
        "HEAD_REF": head,
        "PR_NUMBER": "42",
        "PR_REPO": REPOSITORY,
        "GITHUB_TOKEN": TOKEN,
    }


@pytest.mark.process
def test_script_posts_the_replay_and_the_diff(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    base = _git(policy_repo, "rev-parse", "HEAD")
    head = _commit_policy(
        policy_repo, "shed_while_production_above: 0.65 ", "shed_while_production_above: 0.70 "
    )
    _git(policy_repo, "checkout", "-q", base)  # the work tree is not what is judged
    github.load("list_comments_unmarked.json", "create_comment.json")
    run, whatif_calls = _run_script(policy_repo, tmp_path, github, **_posting(base, head))
    assert run.returncode == 0, run.stderr
    assert whatif_calls == [
        f"--base {base[:7]} --head {head[:7]} --policy-path policy/pool.yaml "
        "--markdown build/whatif/comment.md --plots build/whatif"
    ]
    assert github.calls() == [
        "GET /repos/acme/gpupool-policy/issues/42/comments?per_page=100",
        "POST /repos/acme/gpupool-policy/issues/42/comments",
    ]
    assert github.received[1].headers["authorization"] == f"Bearer {TOKEN}"
    posted = github.received[1].body
    assert isinstance(posted, dict)
    body = posted["body"]
    assert body == (run.out / "pr-comment.md").read_text(encoding="utf-8")
    assert body.startswith("<!-- gpupool-whatif -->\n## gpupool policy check: `policy/pool.yaml`")
    assert f"at `{head[:7]}` (base `{base[:7]}`): ok (2 node pools, 1 flex workloads)" in body
    # the replay's markdown, as written, less its own marker line: one marker, at the top
    report = (run.out / "comment.md").read_text(encoding="utf-8")
    assert report.startswith("<!-- gpupool-whatif -->\n")
    assert report.split("\n", 1)[1] in body and body.count("<!-- gpupool-whatif -->") == 1
    assert "### What-if replay (stand-in)" in body and (run.out / "utilization.svg").exists()
    # the head policy's own sweep: the verdict line, before the replay
    advised = (tmp_path / "advise-calls.txt").read_text().split()
    assert advised[0] == "--policy" and advised[1].endswith("/head/policy/pool.yaml")
    assert advised[2:] == ["--out", "build/whatif/advice"]
    assert body.index("\nFront: stand-in verdict\n") < body.index("### What-if replay")
    # the rendered diff, collapsed, after the replay
    details = body.index("<details><summary>Rendered manifest diff")
    assert body.index("### What-if replay") < details
    assert "</summary>\n\n```diff\n0 added, 0 removed, 3 changed\n" in body
    assert (
        "-      shed_while_production_above: 0.65\n+      shed_while_production_above: 0.7\n"
        in body[details:]
    )
    assert body.rstrip().endswith("</details>")
    assert (run.out / "policy.diff").read_text(encoding="utf-8") in body
    assert run.stdout == (
        f"created https://github.com/acme/gpupool-policy/pull/42#issuecomment-{CREATED_ID}\n"
    )


@pytest.mark.process
def test_the_sweep_replays_the_trace_a_tuner_proposal_commits(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    """A head with ``advise/production.csv`` beside the policy (what the tuner's advise lever
    commits): the check's sweep replays that production, not the bundled sample."""
    base = _git(policy_repo, "rev-parse", "HEAD")
    (policy_repo / "policy" / "advise").mkdir()
    (policy_repo / "policy" / "advise" / "production.csv").write_text(
        "timestamp,gpus_demanded,duty_cycle\n0,16,0.8\n60,16,0.8\n"
    )
    _git(policy_repo, "add", "policy/advise")
    head = _commit_policy(policy_repo, "reserve_ratio: 0.20", "reserve_ratio: 0.05")
    run, _ = _run_script(policy_repo, tmp_path, github, BASE_REF=base, HEAD_REF=head)
    assert run.returncode == 0, run.stderr
    advised = (tmp_path / "advise-calls.txt").read_text().split()
    assert advised[2] == "--prod-trace"
    assert advised[3].endswith("/head/policy/advise/production.csv")
    assert advised[4:] == ["--out", "build/whatif/advice"]


@pytest.mark.slow
def test_script_posts_the_real_replay_of_both_refs(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    """End to end: validate, diff and the real closed-loop replay of base and head."""
    base = _git(policy_repo, "rev-parse", "HEAD")
    head = _commit_policy(policy_repo, "reserve_ratio: 0.20 ", "reserve_ratio: 0.30 ")
    github.load("list_comments_unmarked.json", "create_comment.json")
    gpupool = Path(sys.executable).parent / "gpupool"
    run, _ = _run_script(
        policy_repo,
        tmp_path,
        github,
        GPUPOOL_WHATIF=f"{gpupool} whatif --hours 0.5",
        GPUPOOL_ADVISE=f"{gpupool} advise --hours 0.5 --vary gpu-prod.reserve_ratio=0.2,0.1",
        **_posting(base, head),
    )
    assert run.returncode == 0, run.stderr
    posted = github.received[1].body
    assert isinstance(posted, dict)
    body = posted["body"]
    assert body.count("<!-- gpupool-whatif -->") == 1
    assert f"## gpupool what-if: `{base[:7]}` -> `{head[:7]}`, 0.5 h replay" in body
    assert "production pod-minutes unmet" in body and "harvested GPU-h" in body
    assert "Closed-loop checks (head):" in body
    # the head (reserve 0.3) against its own sweep, whichever way a half-hour replay decides
    front = (run.out / "advice" / "advise.md").read_text(encoding="utf-8")
    (line,) = (x for x in front.splitlines() if x.startswith("Front: the current policy is "))
    assert f"\n{line}\n" in body
    assert (run.out / "advice" / "pareto.png").is_file()
    # the reserve is a lever that changes the cluster: the rendered budget rule differs
    assert "* 0.3) or vector(0))" in (run.out / "policy.diff").read_text(encoding="utf-8")
    assert {"head-gpus.png", "base-gpus.png"} <= {p.name for p in run.out.iterdir()}


@pytest.mark.process
def test_failing_validation_still_posts_why_then_fails(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    base = _git(policy_repo, "rev-parse", "HEAD")
    head = _commit_policy(
        policy_repo, "shed_while_production_above: 0.65 ", "shed_while_production_above: 0.20 "
    )
    github.load(
        "list_comments_page1_next.json", "list_comments_page2_marked.json", "update_comment.json"
    )
    run, whatif_calls = _run_script(policy_repo, tmp_path, github, **_posting(base, head))
    assert run.returncode == 1
    assert "does not validate" in run.stderr
    assert whatif_calls == []  # no replay of an invalid policy
    assert github.calls()[-1] == f"PATCH /repos/acme/gpupool-policy/issues/comments/{MARKED_ID}"
    posted = github.received[-1].body
    assert isinstance(posted, dict)
    body = posted["body"]
    assert "**Validation failed**" in body
    lines = (policy_repo / "policy" / "pool.yaml").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "grow_while_production_below" in text)
    assert f"policy/pool.yaml:{line}: elastic.grow_while_production_below:" in body
    assert "shed_while_production_above (0.2)" in body
    assert "<details>" not in body


@pytest.mark.process
def test_without_a_token_nothing_is_posted(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    base = _git(policy_repo, "rev-parse", "HEAD")
    _commit_policy(
        policy_repo, "shed_while_production_above: 0.65 ", "shed_while_production_above: 0.70 "
    )
    github.load()
    run, whatif_calls = _run_script(
        policy_repo, tmp_path, github, BASE_REF=base, PR_NUMBER="42", PR_REPO=REPOSITORY
    )
    assert run.returncode == 0, run.stderr
    assert "not posting" in run.stderr and github.received == []
    assert len(whatif_calls) == 1 and "--head" in whatif_calls[0]  # HEAD_REF defaults to HEAD
    assert "<details>" in (run.out / "pr-comment.md").read_text(encoding="utf-8")


@pytest.mark.process
def test_a_diff_that_does_not_fit_is_left_to_the_artifact(
    policy_repo: Path, tmp_path: Path, github: ReplayGitHub
) -> None:
    """A change every rate() reads: its diff is many expressions, too long beside the
    replay's report."""
    base = _git(policy_repo, "rev-parse", "HEAD")
    head = _commit_policy(policy_repo, "rate_window: 5m", "rate_window: 4m")
    github.load("list_comments_unmarked.json", "create_comment.json")
    run, _ = _run_script(
        policy_repo,
        tmp_path,
        github,
        **_posting(base, head),
        WHATIF_PAD="62000",
        RUN_URL="https://ci.example.com/run/7",
    )
    assert run.returncode == 0, run.stderr
    posted = github.received[-1].body
    assert isinstance(posted, dict)
    body = posted["body"]
    assert len(body) <= forge.MAX_COMMENT_CHARS
    assert "w" * 62000 in body and "<details>" not in body
    assert "does not fit in the comment: see `build/whatif/policy.diff`" in body
    assert "[this run](https://ci.example.com/run/7)" in body
    assert "rate_window: 4m" in (run.out / "policy.diff").read_text(encoding="utf-8")


@pytest.mark.process
def test_bad_refs_are_usage_errors(policy_repo: Path, tmp_path: Path, github: ReplayGitHub) -> None:
    run, _ = _run_script(policy_repo, tmp_path, github, BASE_REF="no-such-ref")
    assert run.returncode == 2 and "BASE_REF 'no-such-ref' is not a commit" in run.stderr
    run, _ = _run_script(policy_repo, tmp_path, github)
    assert run.returncode == 2 and "BASE_REF is not set" in run.stderr


# --- the workflow --------------------------------------------------------------------------


def test_workflow_runs_the_script_with_the_event_refs() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert workflow[True] == {"pull_request": {"paths": ["policy/**"]}}  # YAML 1.1: on -> True
    assert workflow["permissions"] == {"contents": "read", "pull-requests": "write"}
    steps = workflow["jobs"]["policy-check"]["steps"]
    uses = {step.get("uses", "").split("@")[0]: step for step in steps}
    (policy_checkout,) = (s for s in steps if s.get("with", {}).get("path") == "policy-repo")
    assert policy_checkout["uses"].startswith("actions/checkout@")
    assert policy_checkout["with"]["fetch-depth"] == 0
    assert policy_checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"
    assert uses["actions/setup-python"]["with"]["python-version"] == "3.11"
    assert uses["actions/upload-artifact"]["with"]["path"] == "policy-repo/build/whatif"
    assert uses["actions/upload-artifact"]["if"] == "always()"
    (check,) = (s for s in steps if "policy-check.sh" in s.get("run", ""))
    env = check["env"]
    assert env["BASE_REF"] == "${{ github.event.pull_request.base.sha }}"
    assert env["HEAD_REF"] == "${{ github.event.pull_request.head.sha }}"
    assert env["PR_NUMBER"] == "${{ github.event.pull_request.number }}"
    assert "secrets.GITHUB_TOKEN" in env["GITHUB_TOKEN"]
    assert check["working-directory"] + "/" + env["OUT_DIR"] == "policy-repo/build/whatif"
    (install,) = (s for s in steps if "pip install" in s.get("run", ""))
    assert "$GPUPOOL_PACKAGE" in install["run"] and workflow["env"]["GPUPOOL_PACKAGE"]
