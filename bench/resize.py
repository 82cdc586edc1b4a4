"""Peak memory of a KV shrink and grow in a real vLLM engine, against one layer of the pool.

Starts an in-process vLLM engine (the repository's tiny Llama config with ``--layers``
layers and random weights, ``--blocks`` blocks of 32 tokens, the gpupool plugin active, so
every layer's KV is an allocation of its own), fills the KV with noise (every page resident,
as in a used pool), then shrinks the pool to ``--shrink-to`` blocks and grows it back with
the plugin's control requests, the ones the sidecar sends (pack, then resize). Each request
is measured with ``runtime.kvcache.in_vllm.worker_side.MemoryWatch``: on CPU the kernel's
high-water mark of the process's RSS (``VmHWM``, reset through ``/proc/<pid>/clear_refs``),
on CUDA the caching allocator's peak reserved bytes; the engine is in-process, so that is
the worker's memory. Printed per request: the peak beyond the larger of the pool before and
after ("extra"), one layer of the smaller pool, their ratio, the extra a whole new buffer
beside the old one would need (the smaller pool), the memory measurably returned, the pause,
and the load average before and after.

    python bench/resize.py                             # 16 layers x 4096 blocks (512 MiB)
    python bench/resize.py --layers 32 --blocks 8192   # 2 GiB pool
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TINY_LLAMA = REPO / "tests" / "fixtures" / "tiny-llama"
BLOCK_TOKENS = 32
MIB = 2**20
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the worker runs in this process: its memory is ours
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # the plugin's runner (docs/kvcache.md, GPU notes)
    "HF_HUB_OFFLINE": "1",
    "GPUPOOL_KV_COMPACTION": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # CPU: KV sized in bytes, so no 92 %-of-RAM start-up check
}


def _loadavg() -> str:
    """1, 5 and 15 minute load averages (what else ran while the figures were taken)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _engine(layers: int, blocks: int) -> Any:
    os.environ.update(ENGINE_ENV)
    from vllm import LLM

    from runtime.kvcache.in_vllm import plugin

    plugin.register()
    return LLM(
        model=str(TINY_LLAMA),
        load_format="dummy",
        skip_tokenizer_init=True,
        block_size=BLOCK_TOKENS,
        max_model_len=512,
        enforce_eager=True,
        num_gpu_blocks_override=blocks,
        hf_overrides={"num_hidden_layers": layers},
        seed=0,
    )


def _fill_with_noise(runner: Any) -> None:
    """Every KV page written, so resident. A function, not a loop in ``main``: its loop
    variable would keep the last layer's old allocation alive through the shrink."""
    for view in runner.kv_caches:
        view.normal_()


def _measured(core: Any, runner: Any, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """One control request with the worker's memory watched around it."""
    from runtime.kvcache.in_vllm.worker_side import MemoryWatch

    device = runner.kv_caches[0].device
    tensors = runner.kv_cache_config.kv_cache_tensors
    before = sum(t.size for t in tensors)
    watch = MemoryWatch(device)
    started = time.perf_counter()
    outcome = core.gpupool_kv(op, args)
    pause = time.perf_counter() - started
    if outcome["status"] != "done":
        raise SystemExit(f"bench/resize.py: {op} did not run: {outcome}")
    peak = watch.peak_extra_bytes()
    if peak is None:
        raise SystemExit("bench/resize.py: this platform cannot reset its peak memory measure")
    after = sum(t.size for t in runner.kv_cache_config.kv_cache_tensors)
    layer = min(before, after) // len(tensors)
    return {
        "op": op,
        "blocks": runner.kv_cache_config.num_blocks,
        "pool_bytes_before": before,
        "pool_bytes_after": after,
        "layer_bytes": layer,
        "extra_bytes": peak,
        "extra_over_layer": round(peak / layer, 3),
        "whole_buffer_extra_bytes": min(before, after),
        "released_bytes": watch.released_bytes(),
        "pause_s": round(pause, 3),
        "device": str(device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=4096, help="pool size at start")
    parser.add_argument("--shrink-to", type=int, help="blocks after the shrink (default half)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args()
    target = options.shrink_to or options.blocks // 2
    if not 2 <= target < options.blocks:
        raise SystemExit(f"bench/resize.py: --shrink-to {target}: expected 2..{options.blocks - 1}")
    load_before = _loadavg()
    llm = _engine(options.layers, options.blocks)
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    _fill_with_noise(runner)
    from runtime.kvcache.limits import CompactionLimits

    limits = CompactionLimits(max_moves=4096, saturation_usage=0.8).__dict__
    rows = [
        _measured(core, runner, "shrink", {"num_blocks": target, "limits": limits}),
        _measured(core, runner, "grow", {}),
    ]
    report = {
        "layers": options.layers,
        "load_before": load_before,
        "load_after": _loadavg(),
        "rows": rows,
    }
    if options.json:
        print(json.dumps(report))
        return
    print(
        f"{options.layers} layers, {options.blocks} -> {target} -> {options.blocks} blocks of "
        f"{BLOCK_TOKENS} tokens; load average before {load_before}, after {report['load_after']}"
    )
    print(
        "op      blocks  pool MiB before -> after  layer MiB  extra MiB  extra/layer  "
        "all-at-once MiB  released MiB  pause s  device"
    )
    for row in rows:
        print(
            f"{row['op']:<7} {row['blocks']:>6}  {row['pool_bytes_before'] / MIB:>15.1f} -> "
            f"{row['pool_bytes_after'] / MIB:>5.1f}  {row['layer_bytes'] / MIB:>9.1f}  "
            f"{row['extra_bytes'] / MIB:>9.1f}  {row['extra_over_layer']:>11.2f}  "
            f"{row['whole_buffer_extra_bytes'] / MIB:>15.1f}  "
            f"{row['released_bytes'] / MIB:>12.1f}  {row['pause_s']:>7.3f}  {row['device']}"
        )


if __name__ == "__main__":
    main()
