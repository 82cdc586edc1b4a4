"""KV compaction throughput against a plain copy of the same bytes, measured in the same run.

A vLLM-shaped KV allocation (one backing buffer, per-layer views
``[blocks, heads, block_size, 2*head_size]`` in the physical order of ``--layout``, as
vLLM 0.32's ``KVCacheLayout`` strides them) has a random ``--live`` share of its blocks
occupied; the planner packs them below the packed watermark and the mover copies them.
Each strategy's bytes/s is reported as a ratio of ``dst.copy_(src)`` over the same number
of bytes (contiguous, preallocated and touched; timed alternately with the strategy, and
the median of the per-pair ratios reported, because these machines are shared), plus the
pause (plan + move) per GiB of live KV. Every strategy is checked before it is timed: each
(layer, block) starts with its own value and must end with its source's.

Rows: on CPU ``runs`` (the default, NumPy slice copies), ``runs-torch`` (one torch
``copy_`` per run and layer) and ``gather``; on CUDA ``fused`` (the default there: the
Triton gather-scatter kernel, one launch per pass), ``runs`` (torch ``copy_`` per run and
layer) and ``gather``, plus ``fused-tN`` rows for each ``--tile-words N``. The load
average before and after is printed with the figures (read it before trusting a ratio).

    python bench/compaction.py                  # CPU
    python bench/compaction.py --device cuda    # GPU (e.g. H200; needs torch and triton)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.kvcache.in_vllm.mover import BlockMover, coalesce, layer_groups
from runtime.kvcache.planner import Move, packed_watermark, plan_moves

GIB = 1024**3
ORDERS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "LHBNC": (0, 2, 1, 3, 4),
}
"""Physical order of the logical ``[layer, block, head, token, channel]`` dims (vLLM's
``KVCacheLayout`` values): CPU/Triton, FlashAttention/FlashInfer on Hopper, blocks
outermost, heads outside blocks (each block one chunk per head)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn``, device work included."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def kv_views(
    layers: int, blocks: int, page_bytes: int, device: torch.device, layout: str
) -> list[torch.Tensor]:
    """Per-layer bf16 views ``[blocks, heads, block_size, 2*head]`` of one int8 buffer."""
    heads, block_size = 8, 16
    logical = (layers, blocks, heads, block_size, page_bytes // (heads * block_size * 2))
    order = ORDERS[layout]
    buffer = torch.empty(layers * blocks * page_bytes, dtype=torch.int8, device=device)
    physical = buffer.view(torch.bfloat16).view(*(logical[d] for d in order))
    stacked = physical.permute(*(order.index(d) for d in range(5)))
    return list(stacked.unbind(0))


def plan(blocks: int, live: float, seed: int) -> tuple[list[Move], int]:
    """Moves packing a random ``live`` share of blocks; also the number of live blocks."""
    rng = random.Random(seed)
    ids = list(range(1, blocks))
    occupied = set(rng.sample(ids, int(live * len(ids))))
    free = set(ids) - occupied
    return plan_moves(occupied, free, packed_watermark(len(occupied))), len(occupied)


class Contents:
    """Gives every (layer, block) its own value and checks a pass moved exactly the plan."""

    def __init__(self, views: list[torch.Tensor], blocks: int, moves: list[Move]) -> None:
        self.groups = layer_groups(views, blocks)
        device = views[0].device
        self.before = torch.arange(blocks, device=device)
        self.after = self.before.clone()
        self.after[[m.dst for m in moves]] = torch.tensor([m.src for m in moves], device=device)

    def _values(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Per group ``[layers, blocks, chunks, words]``: ``layer * blocks + ids[block]``."""
        values, first = [], 0
        for group in self.groups:
            layer = torch.arange(first, first + group.shape[0], device=group.device)
            value = (layer[:, None] * len(ids) + ids[None, :])[..., None, None]
            values.append(value.to(group.dtype).expand_as(group))
            first += group.shape[0]
        return values

    def fill(self) -> None:
        for group, value in zip(self.groups, self._values(self.before), strict=True):
            group.copy_(value)

    def check(self, name: str) -> None:
        expected = self._values(self.after)
        if not all(torch.equal(g, v) for g, v in zip(self.groups, expected, strict=True)):
            raise SystemExit(f"bench/compaction.py: {name} moved the wrong bytes")


def _loadavg() -> str:
    """1, 5 and 15 minute load averages (what else ran while the figures were taken)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise SystemExit(f"bench/compaction.py: --device {name}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"bench/compaction.py: --device {name} needs a CUDA GPU; torch {torch.__version__} "
            "sees none"
        )
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"bench/compaction.py: --device {name}: expected cpu or cuda")
    return device


Row = Callable[[list[Move]], object]
"""One pass of a strategy over a plan."""


def _rows(views: list[torch.Tensor], fused: bool, tiles: list[int]) -> dict[str, Row]:
    """The default mover of the device (``fused`` on CUDA) first, then the alternatives."""
    if not fused:
        movers = {
            "runs": BlockMover(views, "runs"),
            "runs-torch": BlockMover(views, "runs", numpy_copies=False),
        }
    else:
        movers = {"fused": BlockMover(views), "runs": BlockMover(views, "runs", fused=False)}
    movers["gather"] = BlockMover(views, "gather", fused=False)
    rows: dict[str, Row] = {name: mover.move for name, mover in movers.items()}
    if tiles and fused:
        from runtime.kvcache.in_vllm.triton_mover import gather_scatter

        groups = movers["fused"].groups

        def tiled(moves: list[Move], tile: int) -> None:
            src = torch.tensor([m.src for m in moves], device=groups[0].device)
            dst = torch.tensor([m.dst for m in moves], device=groups[0].device)
            for group in groups:
                gather_scatter(group, src, dst, tile_words=tile)

        for tile in tiles:
            rows[f"fused-t{tile}"] = lambda moves, t=tile: tiled(moves, t)  # type: ignore[misc]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--layout", default="LBHNC", choices=sorted(ORDERS))
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--page-kib", type=int, default=64, help="KV page per layer per block")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--live", type=float, default=0.5, help="share of blocks occupied")
    parser.add_argument("--repeat", type=int, default=5, help="timed pairs per row")
    parser.add_argument("--calls", type=int, help="moves per timing (default 1 CPU, 20 CUDA)")
    parser.add_argument(
        "--tile-words", default="", help="CUDA: extra fused rows, comma-separated tiles"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    device = _device(args.device)
    calls = args.calls or (20 if device.type == "cuda" else 1)
    load_before = _loadavg()
    page = args.page_kib * 1024
    views = kv_views(args.layers, args.blocks, page, device, args.layout)
    moves, num_live = plan(args.blocks, args.live, args.seed)
    runs = coalesce(moves)
    moved_bytes = len(moves) * args.layers * page
    live_gib = num_live * args.layers * page / GIB
    contents = Contents(views, args.blocks, moves)

    # the baseline gets the same widest-word treatment as the mover: a fair plain copy
    src = torch.ones(moved_bytes // 8, dtype=torch.int64, device=device)
    dst = torch.zeros_like(src)

    def baseline() -> None:
        dst.copy_(src)

    tiles = [int(t) for t in args.tile_words.split(",") if t]
    results: dict[str, dict[str, float]] = {}
    copy_rates: list[float] = []
    for name, row in _rows(views, device.type == "cuda", tiles).items():
        contents.fill()
        row(moves)  # warm-up (compiles the Triton kernel) and the check
        contents.check(name)
        ratios, rates, pauses = [], [], []
        for _ in range(args.repeat):  # interleaved, so load from other processes hits both
            base_s = _seconds(baseline, device, calls)
            move_s = _seconds(lambda r=row: r(moves), device, calls)  # type: ignore[misc]
            pause_s = _seconds(
                lambda r=row: r(plan(args.blocks, args.live, args.seed)[0]),  # type: ignore[misc]
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
        "layout": args.layout,
        "layers": args.layers,
        "page_kib": args.page_kib,
        "blocks": args.blocks,
        "live_blocks": num_live,
        "moves": len(moves),
        "runs": len(runs),
        "moved_mib": moved_bytes / 2**20,
        "live_kv_gib": live_gib,
        "calls_per_timing": calls,
        "copy_gib_per_s": statistics.median(copy_rates),
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "cpus": os.cpu_count(),
        "strategies": results,
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{report['device']}, torch {report['torch']}, {args.layout}: "
        f"{args.layers} layers x {args.page_kib} KiB pages, "
        f"{args.blocks} blocks, {num_live} live, {len(moves)} moves in {len(runs)} runs "
        f"({report['moved_mib']:.0f} MiB moved, {live_gib:.2f} GiB live)"
    )
    print(f"  load average before {load_before}, after {report['loadavg_after']}")
    print(f"  plain copy_ of the same bytes: {report['copy_gib_per_s']:.2f} GiB/s (baseline)")
    for name, r in results.items():
        print(
            f"  {name:10s} {r['gib_per_s']:7.2f} GiB/s  {r['ratio_to_copy']:.2f}x copy "
            f"(range {r['ratio_min']:.2f}-{r['ratio_max']:.2f})  "
            f"pause {r['pause_ms_per_live_gib']:.1f} ms per GiB of live KV"
        )


if __name__ == "__main__":
    main()
