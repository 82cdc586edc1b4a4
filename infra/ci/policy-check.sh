#!/usr/bin/env bash
# shellcheck disable=SC2016  # single-quoted backticks are markdown, not substitutions
# Pull-request check of a gpupool policy repository, for any CI system (bash, git, tar).
#
#   infra/ci/policy-check.sh [BASE_REF [HEAD_REF]]
#
# Run it anywhere inside the policy repository's clone (it works from the top level; the
# paths below are relative to it). It judges the policy as committed at HEAD_REF, read with
# `git archive`, never the work tree (CI systems often check out a merge commit):
#
#   1. gpupool validate  POLICY at HEAD_REF (model configs beside it, as committed);
#   2. gpupool diff      POLICY at BASE_REF and at HEAD_REF (the rendered objects);
#   3. $GPUPOOL_WHATIF --base BASE --head HEAD --policy-path POLICY
#        --markdown OUT_DIR/comment.md --plots OUT_DIR
#      (the closed-loop replay; skipped when validation failed);
#   3b. $GPUPOOL_ADVISE --policy POLICY (at HEAD_REF) --out OUT_DIR/advice: a sweep around
#      the head policy (on POLICY's folder's advise/production.csv at HEAD_REF when it has
#      one: the trace the tuner's advise lever commits); the comment says whether the head
#      lies on the Pareto front of its own sweep (advisory: a failed sweep is said, never
#      fails the check);
#   4. writes OUT_DIR/pr-comment.md: the verdict, the replay's markdown and the diff in a
#      collapsed <details> section when it fits GitHub's limit (otherwise a pointer to
#      OUT_DIR/policy.diff), and posts it with `gpupool pr-comment` when GITHUB_TOKEN,
#      PR_REPO and PR_NUMBER are all set (the comment starting with COMMENT_MARKER is
#      updated, so each push edits the same comment).
#
# A failing validation (or replay) still posts its comment, which says why, and then exits 1.
#
# Environment (the arguments win over BASE_REF and HEAD_REF):
#   BASE_REF        what the pull request merges into (required), any commit-ish
#   HEAD_REF        the pull request's commit (default HEAD)
#   POLICY          policy file in the repository (default policy/pool.yaml)
#   OUT_DIR         output folder, to keep as a CI artifact (default build/whatif)
#   GPUPOOL         the gpupool command (default gpupool)
#   GPUPOOL_WHATIF  the replay command (default "$GPUPOOL whatif"); split on blanks
#   GPUPOOL_ADVISE  the sweep command (default "$GPUPOOL advise --budget-s 600"); split on
#                   blanks; "off" skips the sweep
#   PR_NUMBER       pull request number
#   PR_REPO         OWNER/NAME (default $GITHUB_REPOSITORY)
#   GITHUB_TOKEN    token that may comment (pull-requests: write); unset: nothing is posted
#   GITHUB_API_URL  REST API root (default https://api.github.com; Actions sets it)
#   COMMENT_MARKER  hidden first line of the comment (default <!-- gpupool-whatif -->);
#                   give each policy of one repository its own
#   RUN_URL         page of this CI run, linked for the artifacts (default in GitHub
#                   Actions: $GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID)
#
# Exit status: 0 valid and replayed; 1 validation or replay failed, or posting failed;
# 2 bad usage (refs, paths, not a git repository).
set -euo pipefail

die() {
  printf 'policy-check: %s\n' "$*" >&2
  exit 2
}
log() { printf 'policy-check: %s\n' "$*" >&2; }

BASE_REF="${1:-${BASE_REF:-}}"
HEAD_REF="${2:-${HEAD_REF:-HEAD}}"
POLICY="${POLICY:-policy/pool.yaml}"
OUT_DIR="${OUT_DIR:-build/whatif}"
GPUPOOL="${GPUPOOL:-gpupool}"
GPUPOOL_WHATIF="${GPUPOOL_WHATIF:-$GPUPOOL whatif}"
GPUPOOL_ADVISE="${GPUPOOL_ADVISE:-$GPUPOOL advise --budget-s 600}"
PR_NUMBER="${PR_NUMBER:-}"
PR_REPO="${PR_REPO:-${GITHUB_REPOSITORY:-}}"
COMMENT_MARKER="${COMMENT_MARKER:-<!-- gpupool-whatif -->}"
if [ -z "${RUN_URL:-}" ] && [ -n "${GITHUB_RUN_ID:-}" ]; then
  RUN_URL="${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:-}/actions/runs/$GITHUB_RUN_ID"
fi
RUN_URL="${RUN_URL:-}"
MAX_CHARS=65535 # GitHub refuses comment bodies of 65,536 characters and more

[ -n "$BASE_REF" ] || die "BASE_REF is not set (usage: $0 BASE_REF [HEAD_REF])"
read -r -a gpupool_cmd <<<"$GPUPOOL"
read -r -a whatif_cmd <<<"$GPUPOOL_WHATIF"
read -r -a advise_cmd <<<"$GPUPOOL_ADVISE"
[ "${#gpupool_cmd[@]}" -gt 0 ] || die "GPUPOOL is empty"
[ "${#whatif_cmd[@]}" -gt 0 ] || die "GPUPOOL_WHATIF is empty"
case "$POLICY" in
/* | ../* | */../* | *.. | "") die "POLICY must be a relative path inside the repository, found '$POLICY'" ;;
esac

top=$(git rev-parse --show-toplevel 2>/dev/null) || die "not inside a git work tree: $(pwd)"
cd "$top"
base=$(git rev-parse --verify --quiet "$BASE_REF^{commit}") ||
  die "BASE_REF '$BASE_REF' is not a commit here (CI: fetch the full history, e.g. fetch-depth: 0)"
head=$(git rev-parse --verify --quiet "$HEAD_REF^{commit}") ||
  die "HEAD_REF '$HEAD_REF' is not a commit here"
short_base=$(git rev-parse --short "$base")
short_head=$(git rev-parse --short "$head")
policy_dir=$(dirname "$POLICY")

mkdir -p "$OUT_DIR"
comment="$OUT_DIR/pr-comment.md"
whatif_md="$OUT_DIR/comment.md"
diff_file="$OUT_DIR/policy.diff"
whatif_log="$OUT_DIR/whatif.log"
validation="$OUT_DIR/validate.txt"
rm -f "$comment" "$whatif_md" "$diff_file" "$whatif_log" "$validation"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/policy-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# The policy's directory (the policy and the model configs it names) as committed at $1.
export_policy() {
  mkdir -p "$2"
  git cat-file -e "$1:$POLICY" 2>/dev/null || return 1
  git archive --format=tar "$1" -- "$policy_dir" | tar -x -C "$2"
}

# Characters of file $1 (bytes where no UTF-8 locale exists: never fewer than characters).
chars() { LC_ALL=C.UTF-8 wc -m <"$1" 2>/dev/null | tr -d '[:space:]'; }

# A backtick fence longer than any backtick run that starts a line of file $1.
fence_for() {
  awk '{ line = $0; sub(/^ +/, "", line); if (match(line, /^`+/) && RLENGTH > max) max = RLENGTH }
       END { n = (max >= 3 ? max + 1 : 3); s = ""; for (i = 0; i < n; i++) s = s "`"; print s }' "$1"
}

# A fenced block of file $1 with info string $2 (its last $3 lines, when given).
fenced() {
  local fence
  fence=$(fence_for "$1")
  printf '%s%s\n' "$fence" "$2"
  if [ -n "${3:-}" ]; then tail -n "$3" "$1"; else cat "$1"; fi
  [ -z "$(tail -c 1 "$1")" ] || printf '\n'
  printf '%s\n' "$fence"
}

# --- 1. validate the head -------------------------------------------------------------
valid=0
if export_policy "$head" "$scratch/head"; then
  if (cd "$scratch/head" && "${gpupool_cmd[@]}" validate "$POLICY") >"$validation" 2>&1; then
    valid=1
  fi
else
  printf '%s does not exist at %s\n' "$POLICY" "$short_head" >"$validation"
fi
cat "$validation" >&2

# --- 2. diff the renders --------------------------------------------------------------
diff_note=""
base_has_policy=0
if export_policy "$base" "$scratch/base"; then base_has_policy=1; fi
if [ "$valid" = 1 ] && [ "$base_has_policy" = 1 ]; then
  if ! (cd "$scratch" && "${gpupool_cmd[@]}" diff "base/$POLICY" "head/$POLICY") \
    >"$diff_file" 2>"$scratch/diff.err"; then
    diff_note="The base policy (\`$short_base\`) does not render, so there is no manifest diff:"
    cp "$scratch/diff.err" "$diff_file"
  fi
elif [ "$base_has_policy" = 0 ]; then
  diff_note="\`$POLICY\` is new in this pull request (absent at \`$short_base\`): no diff, no replay."
fi

# --- 3. replay ------------------------------------------------------------------------
replayed=0
whatif_failed=0
if [ "$valid" = 1 ] && [ "$base_has_policy" = 1 ]; then
  log "${whatif_cmd[*]} --base $short_base --head $short_head"
  # short ids (unique here, as git abbreviates them) read better in the replay's report
  if "${whatif_cmd[@]}" --base "$short_base" --head "$short_head" --policy-path "$POLICY" \
    --markdown "$whatif_md" --plots "$OUT_DIR" 2>&1 | tee "$whatif_log" >&2; then
    if [ -s "$whatif_md" ]; then replayed=1; else
      whatif_failed=1
      printf '%s wrote no markdown to %s\n' "${whatif_cmd[*]}" "$whatif_md" >>"$whatif_log"
    fi
  else
    whatif_failed=1
  fi
fi

# --- 3b. the head policy against its own sweep ----------------------------------------
front=""
advise_log="$OUT_DIR/advise.log"
if [ "$valid" = 1 ] && [ "$GPUPOOL_ADVISE" != off ] && [ "${#advise_cmd[@]}" -gt 0 ]; then
  # the production trace a tuner proposal commits beside the policy, when the head has one
  trace_args=()
  head_trace="$scratch/head/$policy_dir/advise/production.csv"
  if [ -f "$head_trace" ]; then trace_args=(--prod-trace "$head_trace"); fi
  log "${advise_cmd[*]} --policy $POLICY ${trace_args[*]+${trace_args[*]}} (at $short_head)"
  if "${advise_cmd[@]}" --policy "$scratch/head/$POLICY" ${trace_args[@]+"${trace_args[@]}"} \
    --out "$OUT_DIR/advice" >"$advise_log" 2>&1; then
    front=$(grep -m 1 '^Front: ' "$OUT_DIR/advice/advise.md" || true)
  fi
  [ -n "$front" ] || front="Front: the sweep around the head policy did not finish (\`$advise_log\`)."
fi

# --- 4. the comment -------------------------------------------------------------------
head_part="$scratch/head.md"
{
  printf '%s\n' "$COMMENT_MARKER"
  printf '## gpupool policy check: `%s`\n\n' "$POLICY"
  if [ "$valid" = 1 ]; then
    printf '`%s` at `%s` (base `%s`): %s\n' "$POLICY" "$short_head" "$short_base" \
      "$(tail -n 1 "$validation" | sed "s|^$POLICY: ||")"
  else
    printf '**Validation failed**: `%s` at `%s` does not load, so nothing was rendered or ' \
      "$POLICY" "$short_head"
    printf 'replayed. Fix these problems:\n\n'
    fenced "$validation" text 200
  fi
  if [ -n "$front" ]; then printf '\n%s\n' "$front"; fi
  if [ "$whatif_failed" = 1 ]; then
    printf '\n**Replay failed**: `%s` did not finish; its output:\n\n' "${whatif_cmd[*]}"
    fenced "$whatif_log" text 60
  fi
} >"$head_part"

artifacts=""
if [ -n "$RUN_URL" ]; then
  artifacts="_Plots, the full replay report and diff: the artifacts of [this run]($RUN_URL)._"
fi

# The replay's markdown, or a pointer when it alone would not fit.
whatif_part="$scratch/whatif.md"
: >"$whatif_part"
if [ "$replayed" = 1 ]; then
  if [ $(($(chars "$head_part") + $(chars "$whatif_md") + 2000)) -le "$MAX_CHARS" ]; then
    {
      printf '\n'
      # its own marker line, if any, goes: the comment has one, at the top
      awk 'NR == 1 && /^<!--.*-->[[:space:]]*$/ { next } { print }' "$whatif_md"
    } >"$whatif_part"
  else
    printf '\n_The replay report (%s characters) does not fit in a comment: see `%s`._\n' \
      "$(chars "$whatif_md")" "$whatif_md" >"$whatif_part"
  fi
fi

# The diff, collapsed, when it fits.
diff_part="$scratch/diff.md"
: >"$diff_part"
if [ -n "$diff_note" ] || [ -f "$diff_file" ]; then
  {
    printf '\n'
    if [ -z "$diff_note" ] && [ "$(cat "$diff_file")" = "no differences" ]; then
      printf '_Rendered manifest diff (`gpupool diff`): no object changes._\n'
    elif [ -f "$diff_file" ]; then
      summary=$(head -n 1 "$diff_file")
      [ -z "$diff_note" ] || summary="does not render"
      printf '<details><summary>Rendered manifest diff (<code>gpupool diff</code>): %s</summary>\n\n' \
        "$summary"
      [ -z "$diff_note" ] || printf '%s\n\n' "$diff_note"
      fenced "$diff_file" diff
      printf '\n</details>\n'
    else
      printf '%s\n' "$diff_note"
    fi
  } >"$diff_part"
fi
footer="$scratch/footer.md"
if [ -n "$artifacts" ]; then printf '\n%s\n' "$artifacts" >"$footer"; else : >"$footer"; fi

total=$(($(chars "$head_part") + $(chars "$whatif_part") + $(chars "$diff_part") + $(chars "$footer")))
if [ "$total" -gt "$MAX_CHARS" ] && [ -f "$diff_file" ]; then
  printf '\n_The rendered manifest diff (%s characters) does not fit in the comment: see `%s`._\n' \
    "$(chars "$diff_file")" "$diff_file" >"$diff_part"
fi
cat "$head_part" "$whatif_part" "$diff_part" "$footer" >"$comment"
log "comment: $comment ($(chars "$comment") characters)"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$comment" >>"$GITHUB_STEP_SUMMARY"; fi

# --- post ---------------------------------------------------------------------------
if [ -n "${GITHUB_TOKEN:-}" ] && [ -n "$PR_REPO" ] && [ -n "$PR_NUMBER" ]; then
  "${gpupool_cmd[@]}" pr-comment --repo "$PR_REPO" --pr "$PR_NUMBER" --body-file "$comment" \
    --marker "$COMMENT_MARKER"
else
  log "not posting: GITHUB_TOKEN, PR_REPO and PR_NUMBER are not all set"
fi

if [ "$valid" != 1 ]; then
  log "FAILED: $POLICY at $short_head does not validate"
  exit 1
fi
if [ "$whatif_failed" = 1 ]; then
  log "FAILED: the replay (${whatif_cmd[*]}) did not finish"
  exit 1
fi
log "ok"
