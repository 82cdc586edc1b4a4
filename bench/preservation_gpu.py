"""The one-shot GPU check of KV preservation (issue 13): KV written by one vLLM engine is a
prefix-cache hit for a fresh engine started on the same snapshot directory.

Serves shared-prefix requests from ``vllm serve`` (the tiny random-weight Llama of
``tests/fixtures/tiny-llama``, ``--load-format dummy --skip-tokenizer-init``, token-id
prompts, greedy) started with the arguments gpupool's own plan emits
(``runtime.vllm.plan_kv_cache`` on ``tests/fixtures/tiny-policy.yaml`` with
``kv_cache.kv_preservation: filesystem``, a GPU attention backend, compaction off and the
snapshot volume mounted at a temp dir), records the outputs and ``/metrics``, waits until the
block files on the snapshot directory stop changing, sends SIGTERM, checks the exit status
and the log, starts a fresh server on the same directory and sends the first prompt again.
Passes when the external prefix-cache counters rose on that first repeated prompt
(``vllm:external_prefix_cache_hits_total`` and
``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``), the outputs equal the
first server's, the first server exited 0 within its bound and its log has no ERROR line.

Needs a CUDA GPU and a CUDA build of vLLM 0.32 (the OffloadingConnector asserts CUDA
tensors); checks both first and exits 2 with the reason when either is missing. Every wait is
bounded (``--budget-s`` in all, 540 s by default: a 10-minute device slot). Progress goes to
stdout as it happens; the verdict is the last line (JSON), also written with both servers'
logs under ``$OUT`` when it is set. Exit 0: pass, 1: fail, 2: not run.

    python bench/preservation_gpu.py
    python bench/preservation_gpu.py --backend flash_attn --requests 6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.device_budget import Budget, say
from policy import load_policy
from runtime.vllm import KvCachePlan, load_model_spec, plan_kv_cache, render_args
from tests.harness.servers import REPO, TINY_MODEL, Server, free_port, start_vllm_server
from tests.harness.tiny_engine import TEST_ONLY_ARGS, TINY_POLICY

VLLM_SERIES = "0.32."
PREFIX_TOKENS = 320
"""Shared prefix: 20 blocks of 16 tokens (the plan's block size for the tiny model)."""
SUFFIX_TOKENS = 40
"""Per request: 2 more full blocks and 8 tokens, so no prompt ends on a block boundary."""
MAX_TOKENS = 8
KV_SHARE = 0.02
"""``kv_cache.max_gpu_memory_share`` for the check: ~2.8 GiB of KV on an H200, plenty for
the tiny model, and a start-up that does not allocate 100 GiB."""
HOST_GIB = 1.0
"""``kv_cache.offload_host_gib``: the pinned host tier (the tiny policy's container has 4 GiB)."""

PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        out["device"] = props.name
        out["total_memory"] = int(props.total_memory)
except Exception as error:
    out["torch_error"] = f"{type(error).__name__}: {error}"
try:
    import vllm
    out["vllm"] = vllm.__version__
    from vllm.platforms import current_platform
    out["vllm_platform"] = str(current_platform.device_type)
except Exception as error:
    out["vllm_error"] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
"""
"""Run in a child so this process never creates a CUDA context beside the servers'."""


def preconditions(timeout_s: float) -> tuple[dict[str, Any], list[str]]:
    """What the child saw, and every unmet precondition (empty: all met)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {}, [f"the torch/vLLM probe did not finish in {timeout_s:.0f} s"]
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {}, [f"the torch/vLLM probe failed: {tail}"]
    seen: dict[str, Any] = json.loads(lines[-1])
    problems = []
    if "torch_error" in seen:
        problems.append(f"import torch failed: {seen['torch_error']}")
    elif not seen.get("cuda"):
        problems.append(f"no CUDA GPU visible to torch {seen.get('torch')}")
    if "vllm_error" in seen:
        problems.append(
            f"import vllm failed ({seen['vllm_error']}): needs a CUDA build of vLLM "
            f"{VLLM_SERIES}x installed in {sys.executable}"
        )
    elif not str(seen.get("vllm", "")).startswith(VLLM_SERIES):
        problems.append(f"vLLM {seen.get('vllm')} is installed; expected {VLLM_SERIES}x")
    elif seen.get("vllm_platform") != "cuda":
        problems.append(
            f"vLLM {seen.get('vllm')} runs on platform {seen.get('vllm_platform')!r}; the "
            "OffloadingConnector needs the CUDA build"
        )
    return seen, problems


def plan_for(snapshot_dir: Path, port: int, gpu_bytes: int, backend: str) -> KvCachePlan:
    """gpupool's plan for the tiny model with filesystem preservation on this GPU."""
    policy = load_policy(TINY_POLICY)
    kv = policy.kv_cache.model_copy(
        update={
            "kv_preservation": "filesystem",
            "offload_host_gib": HOST_GIB,
            "max_gpu_memory_share": KV_SHARE,
        }
    )
    policy = policy.model_copy(update={"kv_cache": kv})
    workload = policy.workloads[0]
    volume = workload.snapshot_volume.model_copy(update={"mount_path": str(snapshot_dir)})
    workload = workload.model_copy(
        update={
            "model": str(TINY_MODEL),
            "port": port,
            "attention_backend": backend,
            "kv_compaction": False,
            "snapshot_volume": volume,
        }
    )
    return plan_kv_cache(policy, workload, load_model_spec(TINY_MODEL), gpu_memory_bytes=gpu_bytes)


def server_env(plan: KvCachePlan) -> dict[str, str | None]:
    """The pod's environment as far as it matters here: gpupool importable (vLLM imports the
    snapshot tier from it), ``PYTHONHASHSEED`` as the policy sets it, the plan's unsets."""
    seed = load_policy(TINY_POLICY).kv_cache.python_hash_seed
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env: dict[str, str | None] = {
        "PYTHONPATH": path,
        "PYTHONHASHSEED": None if seed is None else str(seed),
        "VLLM_CPU_KVCACHE_SPACE": None,
    }
    env.update(dict.fromkeys(plan.env_unset))
    return env


def post(server: Server, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def complete(server: Server, plan: KvCachePlan, prompt: list[int], timeout_s: float) -> list[int]:
    """Greedy completion of a token-id prompt: the generated token ids."""
    body = {
        "model": plan.model_path,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    result = post(server, "/v1/completions", body, timeout_s)
    return [int(t) for t in result["choices"][0]["token_ids"]]


def metrics_text(server: Server, timeout_s: float) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=timeout_s) as response:
        return str(response.read().decode())


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels``; None if there is none."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != name:
            continue
        have = dict(_LABEL.findall(match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
            found = True
    return total if found else None


COUNTERS = {
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total", {}),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total", {}),
    "prompt_tokens_external_kv_transfer": (
        "vllm:prompt_tokens_by_source_total",
        {"source": "external_kv_transfer"},
    ),
    "prompt_tokens_cached_from_disk": (
        "vllm:prompt_tokens_cached_by_source_total",
        {"source": "disk"},
    ),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", {}),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", {}),
    "kv_offload_store_bytes": ("vllm:kv_offload_store_bytes_total", {}),
    "kv_offload_load_bytes": ("vllm:kv_offload_load_bytes_total", {}),
}  # fmt: skip
"""The counters read before and after each step (None where the server has no such series)."""


def counters(server: Server, timeout_s: float) -> dict[str, float | None]:
    text = metrics_text(server, timeout_s)
    return {key: metric(text, name, **labels) for key, (name, labels) in COUNTERS.items()}


def delta(
    after: dict[str, float | None], before: dict[str, float | None]
) -> dict[str, float | None]:
    """What each counter rose by (None: the server exports no such series)."""
    out: dict[str, float | None] = {}
    for name, value in after.items():
        out[name] = None if value is None else value - (before.get(name) or 0.0)
    return out


def block_files(root: Path) -> list[Path]:
    """Every complete block file under the snapshot directory (vLLM writes ``*.bin`` last,
    by rename)."""
    return sorted(root.rglob("*.bin"))


def settle(root: Path, budget: Budget, bound_s: float = 30.0, quiet_s: float = 3.0) -> int:
    """Wait until the number of block files stops changing for ``quiet_s`` (stores drained)."""
    end = time.monotonic() + budget.left(bound_s)
    count, since = len(block_files(root)), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.5)
        now = len(block_files(root))
        if now != count:
            count, since = now, time.monotonic()
        elif count and time.monotonic() - since >= quiet_s:
            break
    return count


def sigterm(server: Server, bound_s: float) -> dict[str, Any]:
    """SIGTERM to the server's main process only, as the kubelet signals a container's PID 1
    (its engine-core child must be shut down by it, not signalled itself); the exit status
    and how long it took. Whatever is left of its process group is killed afterwards."""
    start = time.monotonic()
    os.kill(server.process.pid, signal.SIGTERM)
    try:
        code: int | None = server.process.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        code = None
    seconds = round(time.monotonic() - start, 1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.process.pid, signal.SIGKILL)
    if code is None:
        server.process.wait(timeout=30)
    return {"exit_code": code, "exit_s": seconds, "bound_s": round(bound_s)}


def log_findings(log: Path) -> dict[str, Any]:
    """ERROR lines (vLLM logs a failed block write, a dead engine, a failed shutdown at that
    level; the tiny model's skipped chat-template warm-up is only a WARNING) and the snapshot
    tier's own lines."""
    lines = (log.read_text(errors="replace") if log.exists() else "").splitlines()
    errors = [line for line in lines if " ERROR " in line]
    return {
        "error_lines": len(errors),
        "first_error_lines": errors[:12],
        "shutdown_lines": [line for line in lines if "[shutdown]" in line][-6:],
        "snapshot_tier_lines": [line for line in lines if "gpupool snapshot tier" in line][-4:],
    }


def prompts(count: int, seed: int) -> list[list[int]]:
    """``count`` prompts sharing one prefix; token ids 3..511 (not BOS/EOS)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(PREFIX_TOKENS)]
    return [prefix + [rng.randrange(3, 512) for _ in range(SUFFIX_TOKENS)] for _ in range(count)]


def start(plan: KvCachePlan, workdir: Path, name: str, budget: Budget, bound_s: float) -> Server:
    say(budget, f"starting {name}: vllm {' '.join([*render_args(plan), *TEST_ONLY_ARGS])}")
    server = start_vllm_server(
        [*render_args(plan), *TEST_ONLY_ARGS],
        workdir / name,
        port=plan.port,
        timeout_s=budget.left(bound_s),
        env=server_env(plan),
    )
    say(budget, f"{name} ready at {server.url}")
    return server


def check(
    options: argparse.Namespace,
    gpu_bytes: int,
    workdir: Path,
    budget: Budget,
    report: dict[str, Any],
) -> None:
    """Fills ``report`` as it goes (what it holds survives a failure part way), ending with
    ``checks``."""
    snapshot_dir = workdir / "snapshots"
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    asked = prompts(options.requests, options.seed)
    report |= {"snapshot_dir": str(snapshot_dir), "requests": options.requests}

    plan = plan_for(snapshot_dir, free_port(), gpu_bytes, options.backend)
    report["kv_transfer_config"] = plan.kv_transfer_config
    if plan.kv_transfer_config is None:
        report["failure"] = f"the plan emits no connector: {plan.preservation_note}"
        return
    first = start(plan, workdir, "server-1", budget, options.start_s)
    try:
        before = counters(first, budget.left(10))
        cold = complete(first, plan, asked[0], budget.left(options.request_s))
        warm = complete(first, plan, asked[0], budget.left(options.request_s))
        outputs_1 = [warm] + [
            complete(first, plan, p, budget.left(options.request_s)) for p in asked[1:]
        ]
        say(budget, f"server-1 answered {len(asked) + 1} requests")
        report["server_1_counters"] = delta(counters(first, budget.left(10)), before)
        report["block_files_before_sigterm"] = settle(snapshot_dir, budget)
        say(budget, f"{report['block_files_before_sigterm']} block files; sending SIGTERM")
    except BaseException:
        first.stop()
        raise
    report["server_1_exit"] = sigterm(first, budget.left(plan.shutdown_timeout_s + 60))
    report["server_1_log"] = log_findings(first.log)
    report["block_files_after_exit"] = len(block_files(snapshot_dir))
    say(
        budget, f"server-1 exit {report['server_1_exit']}; {report['block_files_after_exit']} files"
    )

    plan_2 = plan_for(snapshot_dir, free_port(), gpu_bytes, options.backend)
    second = start(plan_2, workdir, "server-2", budget, options.start_s)
    try:
        before = counters(second, budget.left(10))
        restored = complete(second, plan_2, asked[0], budget.left(options.request_s))
        hit = delta(counters(second, budget.left(10)), before)
        end = time.monotonic() + budget.left(10)  # the stat loggers may lag the response
        while not (hit["external_prefix_cache_hits"] or 0) > 0 and time.monotonic() < end:
            time.sleep(0.5)
            hit = delta(counters(second, budget.left(10)), before)
        report["first_repeated_prompt_counters"] = hit
        outputs_2 = [restored] + [
            complete(second, plan_2, p, budget.left(options.request_s)) for p in asked[1:]
        ]
        say(budget, f"server-2 answered {len(asked)} requests; counters {hit}")
        report["server_2_counters"] = delta(counters(second, budget.left(10)), before)
    finally:
        report["server_2_exit"] = sigterm(second, budget.left(plan_2.shutdown_timeout_s + 60))
        report["server_2_log"] = log_findings(second.log)

    report["outputs"] = {
        "server_1_cold_first": cold,
        "server_1": outputs_1,
        "server_2": outputs_2,
        "cold_equals_warm_on_server_1": cold == warm,
    }
    exit_1 = report["server_1_exit"]
    report["checks"] = {
        "block_files_written": report["block_files_before_sigterm"] > 0,
        "server_1_exited_0_in_bound": exit_1["exit_code"] == 0,
        "server_1_log_has_no_error": report["server_1_log"]["error_lines"] == 0,
        "block_files_kept_after_exit": report["block_files_after_exit"]
        >= report["block_files_before_sigterm"]
        > 0,
        "external_prefix_cache_hits_rose": (hit["external_prefix_cache_hits"] or 0) > 0,
        "external_kv_transfer_tokens_rose": (hit["prompt_tokens_external_kv_transfer"] or 0) > 0,
        "outputs_identical": outputs_2 == outputs_1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="triton", choices=["triton", "flash_attn", "flex"])
    parser.add_argument("--requests", type=int, default=4, help="prompts sharing the prefix")
    parser.add_argument("--budget-s", type=float, default=540, help="bound on the whole check")
    parser.add_argument("--start-s", type=float, default=240, help="bound on each server start")
    parser.add_argument("--request-s", type=float, default=60, help="bound on each request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, files)")
    options = parser.parse_args()
    budget = Budget(options.budget_s)
    out = os.environ.get("OUT")
    verdict: dict[str, Any] = {"check": "kv preservation across restart (gpupool issue 13)"}

    seen, problems = preconditions(budget.left(180))
    verdict["environment"] = seen
    if problems:
        verdict |= {"verdict": "NOT RUN", "reason": problems}
        for problem in problems:
            print(f"bench/preservation_gpu.py: cannot run: {problem}", file=sys.stderr)
        _finish(verdict, out, None)
        sys.exit(2)
    say(budget, f"{seen.get('device')}: torch {seen.get('torch')}, vLLM {seen.get('vllm')}")

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-preservation-"))
    report: dict[str, Any] = {}
    try:
        check(options, int(seen["total_memory"]), workdir, budget, report)
        checks: dict[str, bool] = report.get("checks", {})
        passed = bool(checks) and all(checks.values())
        verdict["verdict"] = "PASS" if passed else "FAIL"
        if not checks:
            verdict["reason"] = report.get("failure", "no checks ran")
    except Exception as error:
        verdict |= {"verdict": "FAIL", "reason": f"{type(error).__name__}: {error}"}
        passed = False
    verdict |= report
    verdict["elapsed_s"] = round(budget.elapsed(), 1)
    _finish(verdict, out, workdir)
    if not options.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if passed else 1)


def _finish(verdict: dict[str, Any], out: str | None, workdir: Path | None) -> None:
    """The verdict as the last stdout line; with ``$OUT``, also there with the server logs."""
    if out:
        target = Path(out)
        target.mkdir(parents=True, exist_ok=True)
        (target / "preservation_gpu.json").write_text(json.dumps(verdict, indent=1))
        logs = sorted(workdir.glob("server-*/vllm.log")) if workdir else []
        for log in logs:
            shutil.copy(log, target / f"{log.parent.name}.log")
    print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
