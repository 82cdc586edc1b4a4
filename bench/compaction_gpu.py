"""The one-shot GPU engine check of KV compaction (issue 12): compaction, shrink and grow
inside a real vLLM 0.32 engine, mid-generation, on a pool that fills the device.

Starts an in-process ``vllm.LLM`` with the gpupool plugin registered
(``tests/kvcache/engine.py``: the tiny random-weight Llama of ``tests/fixtures/tiny-llama``,
``--layers`` deep through ``hf_overrides``, 32-token blocks, eager, greedy), its pool sized by
vLLM from ``--gpu-memory-utilization`` (0.9: the device is full) or given as ``--blocks``.
Runs shared-prefix requests in waves without any pass (the reference), then the same
workload with, between steps: compact, shrink to ``--shrink-fraction`` of the pool, grow,
compact, shrink again, grow. Passes when

* the outputs equal the reference's token for token, every pass is ``done`` (a compaction
  may be a ``noop``) and at least one compaction moved blocks, prefix caching kept hitting
  the moved blocks, and the harness's pool and block-table checks hold after every pass;
* each shrink gave the device back at least 90 % of what it removed (blocks removed x bytes
  per block over all layers, from the KV tensors): ``torch.cuda.mem_get_info`` free bytes
  in this process (the engine is in-process) rise by that much, and a grow takes it back;
  the KV tensors have exactly the new size afterwards;
* no resize needed more than 1.5 x one layer of the smaller pool beyond the larger of its
  before and after (``torch.cuda.max_memory_allocated`` around the pass; the worker's own
  ``peak_extra_bytes`` is recorded beside it): per-layer resizing, where one new buffer
  would need the whole smaller pool, which at 0.9 utilization does not fit.

The tiny model's sequences (32 x 512 tokens) cannot fill a device-sized pool, so "full"
means the device, not the pool; the pool's usage at each pass is recorded. The attention
backend and KV layout vLLM chose are printed. ``--device cpu`` runs the same checks on the
CPU build of vLLM (process RSS in place of free device memory, the kernel's RSS high-water
mark in place of the allocator's peak, a ``--blocks`` pool), which is how the script itself
is tested (``tests/kvcache/test_compaction_gpu_script.py``).

Needs a CUDA GPU and a CUDA build of vLLM 0.32 (for ``--device cuda``); checks both first
and exits 2 with the reason when either is missing. Everything is bounded by
``--budget-s`` (300 s): a watchdog writes the verdict and exits 1 when it is spent. Progress
goes to stdout; the verdict is the last line (JSON), also ``$OUT/compaction_gpu.json`` when
``OUT`` is set. Exit 0: pass, 1: fail, 2: not run.

    python bench/compaction_gpu.py
    python bench/compaction_gpu.py --attention-backend TRITON_ATTN --layers 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.device_budget import Budget, say

VLLM_SERIES = "0.32."
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # scheduler and worker in this process
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # the plugin rewrites the V1 runner's block tables
    "HF_HUB_OFFLINE": "1",
    "GPUPOOL_KV_COMPACTION": "1",
}
"""Set before vLLM is imported: the same process measures the device the worker uses."""
DEFAULT_LAYERS = {"cuda": 16, "cpu": 4}
"""Layers of the tiny model: 16 keep a full H200 at ~1M blocks (Python walks the pool) and
make one layer 1/16 of it; 4 keep the CPU run short while not the fixture's own 2."""
DEFAULT_CPU_BLOCKS = 4096
RETURNED_SHARE = 0.9
"""Share of the removed (added) KV bytes the device must get back (give) on a shrink (grow)."""
EXTRA_GOAL_LAYERS = 1.5
"""A resize may need at most this many layers of the smaller pool beyond the larger one."""
LAYER_BLOCK_BYTES = 32 * 2 * 2 * 32 * 2
"""The tiny model's bytes of one block of one layer (32 tokens x 2 KV heads x K+V x 32 x
bf16): only to size the CPU build's KV space before the engine exists."""


class Verdict:
    """The report, filled as the check goes, and written exactly once (main thread or
    watchdog, whichever ends first)."""

    def __init__(self, out: str | None) -> None:
        self.report: dict[str, Any] = {
            "check": "KV compaction, shrink and grow in a vLLM engine (gpupool issue 12)"
        }
        self.out = out
        self._written = threading.Lock()

    def finish(self, code: int, budget: Budget) -> NoReturn:
        """Print (and save) the verdict and end the process with ``code``; a second caller
        never returns, the first one's exit ends it."""
        if not self._written.acquire(blocking=False):
            while True:
                time.sleep(60)
        self.report["elapsed_s"] = round(budget.elapsed(), 1)
        for _ in range(3):  # the watchdog may read it while the main thread still adds to it
            try:
                report = json.loads(json.dumps(self.report, default=str))
                break
            except RuntimeError:
                time.sleep(0.1)
        else:
            report = {key: str(value) for key, value in list(self.report.items())}
        text = json.dumps(report)
        if self.out:
            Path(self.out).mkdir(parents=True, exist_ok=True)
            Path(self.out, "compaction_gpu.json").write_text(json.dumps(report, indent=1))
        print(text, flush=True)
        sys.stderr.flush()
        os._exit(code)  # an in-process engine's teardown is no part of the check


def preconditions(device: str) -> tuple[dict[str, Any], list[str]]:
    """What this process sees (torch, CUDA, vLLM and its platform) and every unmet need."""
    seen: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    problems = []
    if device == "cuda":
        if seen["cuda"]:
            props = torch.cuda.get_device_properties(0)
            seen |= {"gpu": props.name, "total_memory": int(props.total_memory)}
        else:
            problems.append(f"no CUDA GPU visible to torch {torch.__version__}")
    try:
        import vllm
        from vllm.platforms import current_platform

        seen |= {"vllm": vllm.__version__, "vllm_platform": str(current_platform.device_type)}
    except Exception as error:
        problems.append(
            f"import vllm failed ({type(error).__name__}: {error}): needs a "
            f"{'CUDA' if device == 'cuda' else 'CPU'} build of vLLM {VLLM_SERIES}x in "
            f"{sys.executable}"
        )
        return seen, problems
    if not seen["vllm"].startswith(VLLM_SERIES):
        problems.append(f"vLLM {seen['vllm']} is installed; expected {VLLM_SERIES}x")
    elif seen["vllm_platform"] != device:
        build = "CUDA" if device == "cuda" else "CPU"
        problems.append(
            f"vLLM {seen['vllm']} runs on platform {seen['vllm_platform']!r}; --device "
            f"{device} needs its {build} build"
        )
    return seen, problems


class DeviceMemory:
    """What the process holds on the KV's device, measured from outside the plugin."""

    def __init__(self, device: str) -> None:
        self.device = device

    def held_bytes(self) -> int:
        """CUDA: the device's used bytes (total - ``mem_get_info`` free, after a sync);
        CPU: this process's resident set."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            return int(total - free)
        from runtime.kvcache.in_vllm.worker_side import resident_bytes

        return resident_bytes()


class PeakMeter:
    """The most a pass held beyond the larger of its before and after.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the kernel's RSS high-water mark
    (``worker_side.MemoryWatch``). The worker's resize resets the same peak when it starts,
    so the figure covers the resize (where the memory is needed) and not the packing before
    it, whose only allocations are index tensors."""

    def __init__(self, device: str) -> None:
        from runtime.kvcache.in_vllm.worker_side import MemoryWatch

        self.device = device
        if device == "cuda":
            torch.cuda.synchronize()
            self.before = int(torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        self.watch = MemoryWatch(torch.device(device))

    def result(self) -> dict[str, int | None]:
        outside = self.watch.peak_extra_bytes()
        if self.device != "cuda":
            return {"extra_bytes": outside, "reserved_extra_bytes": None}
        torch.cuda.synchronize()
        peak, after = int(torch.cuda.max_memory_allocated()), int(torch.cuda.memory_allocated())
        return {
            "extra_bytes": peak - max(self.before, after),
            "max_allocated_delta_bytes": peak - self.before,
            "reserved_extra_bytes": outside,
        }


def kv_bytes(engine: Any) -> tuple[int, int]:
    """Bytes of every distinct KV allocation the worker binds, and how many there are."""
    storages = {
        v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
        for v in engine.runner.kv_caches
    }
    return sum(storages.values()), len(storages)


def layout(engine: Any) -> dict[str, Any]:
    """The attention backend and KV layout vLLM chose, as the worker side sees them."""
    from runtime.kvcache.in_vllm.mover import LayoutUnsupported, page_geometry

    runner = engine.runner
    view = runner.kv_caches[0]
    try:
        geometry: dict[str, Any] = asdict(page_geometry(view, runner.kv_cache_config.num_blocks))
    except LayoutUnsupported as error:  # the passes are refused then; the verdict says why
        geometry = {"unsupported": str(error)}
    return {
        "attention_backends": sorted(
            {group.backend.get_name() for groups in runner.attn_groups for group in groups}
        ),
        "kv_cache_layout": runner.cache_config.get_resolved_kv_cache_layout().name,
        "view_shape": list(view.shape),
        "view_stride": list(view.stride()),
        "dtype": str(view.dtype),
        "page_geometry": geometry,
        "layers": len(runner.kv_caches),
        "allocations": [len(t.layers) for t in runner.kv_cache_config.kv_cache_tensors],
    }


def schedule(blocks: int, fraction: float) -> dict[int, tuple[str, dict[str, Any]]]:
    """Step -> pass, as ``tests/kvcache/test_engine.py`` drives them: every pass while
    requests are running, the second shrink to a different size than the first."""
    from tests.kvcache.engine import limits

    return {
        3: ("compact", {"limits": limits()}),
        6: ("shrink", {"num_blocks": max(2, int(blocks * fraction)), "limits": limits()}),
        9: ("grow", {}),
        11: ("compact", {"limits": limits()}),
        13: ("shrink", {"num_blocks": max(2, int(blocks * fraction * 1.25)), "limits": limits()}),
        16: ("grow", {}),
    }


def checked(engine: Any) -> str | None:
    """The harness's pool and block-table invariants (None: they hold)."""
    from tests.kvcache.engine import check_engine

    try:
        check_engine(engine)
    except AssertionError as error:
        return f"{error}" or traceback.format_exc(limit=-1).strip()
    return None


class Passes:
    """Runs the scheduled passes from the generation hook and measures each one."""

    def __init__(self, engine: Any, device: str, budget: Budget, plan: dict[int, Any]) -> None:
        from runtime.kvcache.in_vllm import worker_side

        self.engine, self.device, self.budget, self.plan = engine, device, budget, plan
        self.memory = DeviceMemory(device)
        self.records: list[dict[str, Any]] = []
        self.invariant_failures: list[str] = []
        self.worker_resizes: list[dict[str, Any]] = []
        real = worker_side.resize

        def recording(runner: Any, num_blocks: int) -> Any:
            result = real(runner, num_blocks)
            self.worker_resizes.append(asdict(result))
            return result

        worker_side.resize = recording  # the plugin's worker method looks it up per call

    def hook(self, step: int) -> None:
        self.budget.check(step)
        if step in self.plan:
            op, args = self.plan[step]
            self.records.append(self.run(step, op, args))

    def run(self, step: int, op: str, args: dict[str, Any]) -> dict[str, Any]:
        engine = self.engine
        state = engine.control("status")
        blocks_before = engine.pool.num_gpu_blocks
        bytes_before, layers = kv_bytes(engine)
        per_block = bytes_before // blocks_before
        held_before = self.memory.held_bytes()
        resizes_before = len(self.worker_resizes)
        meter = PeakMeter(self.device)
        started = time.perf_counter()
        outcome = engine.control(op, **args)
        seconds = time.perf_counter() - started
        peak = meter.result()
        held_after = self.memory.held_bytes()
        blocks_after = engine.pool.num_gpu_blocks
        bytes_after, _ = kv_bytes(engine)
        record: dict[str, Any] = {
            "step": step,
            "op": op,
            "target_blocks": args.get("num_blocks"),
            "outcome": outcome,
            "seconds": round(seconds, 3),
            "usage_before": round(state["usage"], 4),
            "held_blocks_before": state["held_blocks"],
            "running_before": state["num_running"],
            "blocks_before": blocks_before,
            "blocks_after": blocks_after,
            "bytes_per_block": per_block,
            "kv_bytes_before": bytes_before,
            "kv_bytes_after": bytes_after,
            "kv_tensors_resized": bytes_after == blocks_after * per_block,
            "device_returned_bytes": held_before - held_after,
            "worker_resizes": self.worker_resizes[resizes_before:],
        }
        if op in ("shrink", "grow"):
            removed = (blocks_before - blocks_after) * per_block
            layer = min(blocks_before, blocks_after) * per_block // layers
            worker_peak = outcome.get("peak_extra_bytes")
            if worker_peak is None and record["worker_resizes"]:
                worker_peak = record["worker_resizes"][-1]["peak_extra_bytes"]
            extra = peak["extra_bytes"]
            record |= {
                "removed_bytes": removed,
                "one_layer_bytes": layer,
                "worker_peak_extra_bytes": worker_peak,
                **peak,
                "extra_in_layers": None if extra is None or not layer else round(extra / layer, 3),
            }
        say(self.budget, f"step {step}: {op} {_summary(record)}")
        failure = checked(engine)
        if failure is not None:
            self.invariant_failures.append(f"after the {op} at step {step}: {failure}")
        return record


def _summary(record: dict[str, Any]) -> str:
    outcome = record["outcome"]
    text = (
        f"-> {outcome['status']} {outcome.get('reason') or ''}(moved {outcome['blocks_moved']}, "
        f"{record['blocks_before']} -> {record['blocks_after']} blocks, usage "
        f"{record['usage_before']:.3f}, {record['seconds']:.2f} s"
    )
    if "removed_bytes" in record:
        text += (
            f"; device got back {record['device_returned_bytes'] / 2**20:.0f} MiB of "
            f"{record['removed_bytes'] / 2**20:.0f} MiB removed; extra "
            f"{_mib(record['extra_bytes'])} (worker {_mib(record['worker_peak_extra_bytes'])}) "
            f"vs one layer {record['one_layer_bytes'] / 2**20:.0f} MiB"
        )
    return text + ")"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f} MiB"


def evaluate(
    reference: dict[int, Any], out: dict[int, Any], passes: Passes, plan: dict[int, Any]
) -> dict[str, bool]:
    """Every check the verdict rests on."""
    from tests.kvcache.engine import PREFIX_TOKENS, WAVE_SIZE

    records = passes.records
    resizes = [r for r in records if r["op"] in ("shrink", "grow")]
    shrinks = [r for r in resizes if r["op"] == "shrink"]
    grows = [r for r in resizes if r["op"] == "grow"]
    ok = {"compact": ("done", "noop"), "shrink": ("done",), "grow": ("done",)}
    later = [i for i in out if i >= WAVE_SIZE]
    return {
        "every_pass_ran": [r["step"] for r in records] == sorted(plan),
        "passes_ok": bool(records) and all(r["outcome"]["status"] in ok[r["op"]] for r in records),
        "a_compaction_moved_blocks": any(
            r["outcome"]["blocks_moved"] > 0 for r in records if r["op"] == "compact"
        ),
        "outputs_identical": {i: f.tokens for i, f in out.items()}
        == {i: f.tokens for i, f in reference.items()},
        "prefix_cache_kept_hitting": bool(later)
        and all(out[i].cached_tokens >= PREFIX_TOKENS for i in later),
        "pool_and_tables_hold": not passes.invariant_failures,
        "kv_tensors_resized": bool(resizes) and all(r["kv_tensors_resized"] for r in resizes),
        "memory_returned_on_shrink": bool(shrinks)
        and all(
            r["removed_bytes"] > 0
            and r["device_returned_bytes"] >= RETURNED_SHARE * r["removed_bytes"]
            for r in shrinks
        ),
        "memory_retaken_on_grow": bool(grows)
        and all(
            r["removed_bytes"] < 0
            and -r["device_returned_bytes"] >= RETURNED_SHARE * -r["removed_bytes"]
            for r in grows
        ),
        "resize_extra_within_goal": bool(resizes)
        and all(
            r["extra_bytes"] is not None
            and r["extra_bytes"] <= EXTRA_GOAL_LAYERS * r["one_layer_bytes"]
            for r in resizes
        ),
    }


def start(options: argparse.Namespace, verdict: Verdict, budget: Budget) -> Any:
    """The in-process engine with the plugin registered, and what vLLM chose for it."""
    from tests.harness.servers import TINY_MODEL
    from tests.kvcache.engine import start_engine

    kwargs: dict[str, Any] = {"hf_overrides": {"num_hidden_layers": options.layers}}
    if options.attention_backend:
        kwargs["attention_backend"] = options.attention_backend
    utilization = options.gpu_memory_utilization if options.device == "cuda" else None
    sized = f"{options.blocks} blocks" if options.blocks else f"utilization {utilization}"
    say(budget, f"starting the engine: {options.layers} layers, pool from {sized}")
    engine = start_engine(TINY_MODEL, options.blocks, gpu_memory_utilization=utilization, **kwargs)
    blocks = engine.pool.num_gpu_blocks
    total, allocations = kv_bytes(engine)
    info = layout(engine) | {
        "blocks": blocks,
        "kv_bytes": total,
        "kv_allocations": allocations,
        "gpu_memory_utilization": utilization,
        "max_num_seqs": engine.core.scheduler.max_num_running_reqs,
        "max_model_len": engine.core.scheduler.max_model_len,
    }
    capacity = info["max_num_seqs"] * math.ceil(
        info["max_model_len"] / engine.core.scheduler.block_size
    )
    info["requests_can_fill_pool"] = capacity >= blocks
    if options.device == "cuda":
        free, device_total = torch.cuda.mem_get_info()
        info |= {"device_free_bytes": int(free), "device_total_bytes": int(device_total)}
    verdict.report["engine"] = info
    say(
        budget,
        f"engine ready: backend {info['attention_backends']}, KV layout {info['kv_cache_layout']}"
        f" (view {info['view_shape']} strides {info['view_stride']}, {info['dtype']}, "
        f"page {info['page_geometry']}), {blocks} blocks = {total / 2**30:.2f} GiB "
        f"in {allocations} allocations"
        + (
            f", {info['device_free_bytes'] / 2**30:.1f} of "
            f"{info['device_total_bytes'] / 2**30:.1f} GiB free on the device"
            if options.device == "cuda"
            else ""
        ),
    )
    failure = checked(engine)
    if failure is not None:
        raise AssertionError(f"the fresh engine fails the pool checks: {failure}")
    return engine


def check(options: argparse.Namespace, verdict: Verdict, budget: Budget) -> bool:
    """Reference run, run with passes, checks; fills ``verdict.report`` as it goes."""
    from tests.kvcache.engine import shared_prefix_prompts

    report = verdict.report
    report["stage"] = "engine start"
    engine = start(options, verdict, budget)
    prompts = shared_prefix_prompts(options.requests)

    report["stage"] = "reference run"
    reference = engine.run(prompts, budget.check, max_tokens=options.max_tokens)
    say(budget, f"reference: {len(reference)} requests, no passes")
    plan = schedule(engine.pool.num_gpu_blocks, options.shrink_fraction)
    passes = Passes(engine, options.device, budget, plan)
    report["stage"] = "run with passes"
    report["passes"] = passes.records
    out = engine.run(prompts, passes.hook, max_tokens=options.max_tokens)
    failure = checked(engine)
    if failure is not None:
        passes.invariant_failures.append(f"after the run: {failure}")
    report["stage"] = "done"
    differing = sorted(
        i for i in reference if out.get(i) is None or out[i].tokens != reference[i].tokens
    )
    report["outputs"] = {
        "requests": len(reference),
        "max_tokens": options.max_tokens,
        "differing_requests": differing,
        "distinct_outputs": len({tuple(f.tokens) for f in reference.values()}),
        "cached_tokens": [out[i].cached_tokens for i in sorted(out)],
    }
    report["invariant_failures"] = passes.invariant_failures
    checks = evaluate(reference, out, passes, plan)
    report["checks"] = checks
    return all(checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of the GPU vLLM may take (the pool fills what the model leaves)",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=None,
        help=f"pool size instead (default on cpu: {DEFAULT_CPU_BLOCKS})",
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="model depth (default: cuda 16, cpu 4)"
    )
    parser.add_argument("--shrink-fraction", type=float, default=0.25, help="of the pool")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--attention-backend", default=None, help="e.g. FLASH_ATTN, TRITON_ATTN")
    parser.add_argument("--budget-s", type=float, default=300, help="bound on the whole check")
    options = parser.parse_args()
    budget = Budget(options.budget_s)
    verdict = Verdict(os.environ.get("OUT"))
    if options.layers is None:
        options.layers = DEFAULT_LAYERS[options.device]
    if options.blocks is None and options.device == "cpu":
        options.blocks = DEFAULT_CPU_BLOCKS
    verdict.report |= {"device": options.device, "options": vars(options)}

    os.environ.update(ENGINE_ENV)
    if options.device == "cpu":
        kv_gib = options.blocks * options.layers * LAYER_BLOCK_BYTES / 2**30
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_gib * 1.25)))
    seen, problems = preconditions(options.device)
    verdict.report["environment"] = seen
    if problems:
        for problem in problems:
            print(f"bench/compaction_gpu.py: cannot run: {problem}", file=sys.stderr)
        verdict.report |= {"verdict": "NOT RUN", "reason": problems}
        verdict.finish(2, budget)
    say(budget, f"{seen.get('gpu', 'CPU')}: torch {seen['torch']}, vLLM {seen['vllm']}")

    def expire() -> None:
        verdict.report |= {
            "verdict": "FAIL",
            "reason": f"the budget of {options.budget_s:g} s ran out during "
            f"{verdict.report.get('stage', 'start')}",
        }
        verdict.finish(1, budget)

    watchdog = threading.Timer(max(1.0, budget.deadline - time.monotonic()) + 5.0, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        passed = check(options, verdict, budget)
        verdict.report["verdict"] = "PASS" if passed else "FAIL"
        if not passed:
            failed = [name for name, ok in verdict.report["checks"].items() if not ok]
            verdict.report["reason"] = f"failed: {', '.join(failed)}"
    except Exception as error:
        traceback.print_exc()
        verdict.report |= {"verdict": "FAIL", "reason": f"{type(error).__name__}: {error}"}
        passed = False
    watchdog.cancel()
    verdict.finish(0 if passed else 1, budget)


if __name__ == "__main__":
    main()
