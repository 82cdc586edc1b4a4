"""KV compaction throughput against a plain copy of the same bytes, measured in the same run.

A vLLM-shaped KV allocation (layer outermost, one backing buffer, per-layer views
``[blocks, heads, block_size, 2*head_size]``) has a random ``--live`` share of its blocks
occupied; the planner packs them below the packed watermark and the mover copies them. Each
strategy's bytes/s is reported as a ratio of ``dst.copy_(src)`` over the same number of bytes
(contiguous, preallocated and touched; timed alternately with the strategy, and the
median of the per-pair ratios reported, because these machines are shared), plus the
pause (plan + move) per GiB of live KV. On CPU, ``runs-torch`` is the ``runs`` strategy
with torch ``copy_`` per run (its CUDA path) instead of the default NumPy slice copies.

    python bench/compaction.py                  # CPU
    python bench/compaction.py --device cuda    # GPU (e.g. H200)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.kvcache.mover import BlockMover, coalesce
from runtime.kvcache.planner import Move, packed_watermark, plan_moves

GIB = 1024**3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kv_views(layers: int, blocks: int, page_bytes: int, device: torch.device) -> list[torch.Tensor]:
    """Per-layer bf16 views into one int8 buffer, the way vLLM 0.32 allocates them."""
    heads, block_size = 8, 16
    head2 = page_bytes // (heads * block_size * 2)
    buffer = torch.ones(layers * blocks * page_bytes, dtype=torch.int8, device=device)
    per_layer = blocks * page_bytes
    return [
        buffer[i * per_layer : (i + 1) * per_layer]
        .view(torch.bfloat16)
        .view(blocks, heads, block_size, head2)
        for i in range(layers)
    ]


def plan(blocks: int, live: float, seed: int) -> tuple[list[Move], int]:
    """Moves packing a random ``live`` share of blocks; also the number of live blocks."""
    rng = random.Random(seed)
    ids = list(range(1, blocks))
    occupied = set(rng.sample(ids, int(live * len(ids))))
    free = set(ids) - occupied
    return plan_moves(occupied, free, packed_watermark(len(occupied))), len(occupied)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--page-kib", type=int, default=64, help="KV page per layer per block")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--live", type=float, default=0.5, help="share of blocks occupied")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    device = torch.device(args.device)
    page = args.page_kib * 1024
    views = kv_views(args.layers, args.blocks, page, device)
    moves, num_live = plan(args.blocks, args.live, args.seed)
    runs = coalesce(moves)
    moved_bytes = len(moves) * args.layers * page
    live_gib = num_live * args.layers * page / GIB

    # the baseline gets the same widest-word treatment as the mover: a fair plain copy
    src = torch.ones(moved_bytes // 8, dtype=torch.int64, device=device)
    dst = torch.zeros_like(src)

    def baseline() -> None:
        dst.copy_(src)

    results: dict[str, dict[str, float]] = {}
    copy_rates: list[float] = []
    movers = {"runs": BlockMover(views, "runs")}
    if device.type == "cpu":  # the CUDA path of ``runs``, for comparison with the default
        movers["runs-torch"] = BlockMover(views, "runs", numpy_copies=False)
    movers["gather"] = BlockMover(views, "gather")
    for name, mover in movers.items():
        ratios, rates, pauses = [], [], []
        for _ in range(args.repeat):  # interleaved, so load from other processes hits both
            base_s = _timed(baseline, device, 1)
            move_s = _timed(lambda m=mover: m.move(moves), device, 1)  # type: ignore[misc]
            pause_s = _timed(
                lambda m=mover: m.move(plan(args.blocks, args.live, args.seed)[0]),  # type: ignore[misc]
                device,
                1,
            )
            ratios.append(base_s / move_s)
            rates.append(moved_bytes / move_s / GIB)
            pauses.append(pause_s * 1000 / live_gib)
            copy_rates.append(moved_bytes / base_s / GIB)
        results[name] = {
            "gib_per_s": statistics.median(rates),
            "ratio_to_copy": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "pause_ms_per_live_gib": statistics.median(pauses),
        }

    report = {
        "device": str(device)
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "torch": torch.__version__,
        "layers": args.layers,
        "page_kib": args.page_kib,
        "blocks": args.blocks,
        "live_blocks": num_live,
        "moves": len(moves),
        "runs": len(runs),
        "moved_mib": moved_bytes / 2**20,
        "live_kv_gib": live_gib,
        "copy_gib_per_s": statistics.median(copy_rates),
        "strategies": results,
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{report['device']}, torch {report['torch']}: "
        f"{args.layers} layers x {args.page_kib} KiB pages, "
        f"{args.blocks} blocks, {num_live} live, {len(moves)} moves in {len(runs)} runs "
        f"({report['moved_mib']:.0f} MiB moved, {live_gib:.2f} GiB live)"
    )
    print(f"  plain copy_ of the same bytes: {report['copy_gib_per_s']:.2f} GiB/s (baseline)")
    for name, r in results.items():
        print(
            f"  {name:10s} {r['gib_per_s']:7.2f} GiB/s  {r['ratio_to_copy']:.2f}x copy "
            f"(range {r['ratio_min']:.2f}-{r['ratio_max']:.2f})  "
            f"pause {r['pause_ms_per_live_gib']:.1f} ms per GiB of live KV"
        )


if __name__ == "__main__":
    main()
