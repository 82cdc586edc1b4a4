"""Replay a sweep's variants in parallel processes within a time budget (edge: processes).

The current policy is replayed pooled and as the fixed topology (the sweep's baseline);
every other variant pooled only, on the same inputs. Each variant is validated before
anything runs: an invalid one is reported and skipped, a replay that fails is reported,
and variants the budget did not reach are listed, never dropped. A process pool with the
``multiprocessing.Pool`` interface runs them: the standard library's by default,
``ray.util.multiprocessing.Pool`` with ``ray_address`` (a sweep larger than one machine).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from infra.builders.stack_options import StackOptions, Target
from policy import PolicyError, PoolPolicy, parse_policy
from runtime.advise.levers import CURRENT, Variant
from runtime.sim.options import DEMO, Options, build_whatif
from runtime.sim.report import Summary
from runtime.sim.whatif import run, run_pooled
from runtime.tuner.yamledit import ValueEdit, applied

SweepProgress = Callable[[int, int], None]
"""Called with (variants finished, variants to replay)."""


class SweepError(ValueError):
    """The sweep cannot give an answer (the baseline did not finish); nothing is written."""


@dataclass(frozen=True)
class Point:
    """One variant's outcome: its pooled summary, or why it has none."""

    variant: Variant
    summary: Summary | None = None
    problem: str | None = None
    """Why the variant was not replayed: invalid, failed, or not reached in the budget."""


@dataclass(frozen=True)
class Sweep:
    """Every variant's point, the current policy first, and the fixed topology's summary."""

    points: tuple[Point, ...]
    fixed: Summary
    seconds: float
    jobs: int
    backend: str
    """Where the replays ran: ``processes`` or ``ray ADDRESS``."""

    @property
    def current(self) -> Point:
        return self.points[0]


@dataclass(frozen=True)
class Replayed:
    """A variant that replayed: its pooled summary, and the fixed topology's for the baseline."""

    pooled: Summary
    fixed: Summary | None


@dataclass(frozen=True)
class Failed:
    """A variant whose replay raised: the exception's type and message."""

    why: str


Outcome = Replayed | Failed
"""What a worker sends back for one variant (module level: it crosses process boundaries)."""


@dataclass(frozen=True)
class _Task:
    index: int
    document: dict[str, Any]
    policy_dir: Path
    options: Options
    baseline: bool


class _Pool(Protocol):
    def imap_unordered(self, func: Callable[[_Task], Any], iterable: Sequence[_Task]) -> Any: ...

    def terminate(self) -> None: ...

    def join(self) -> None: ...


def sweep_options(
    prod_trace: str | None,
    *,
    flex_traces: Sequence[str] = (),
    backlogs: Sequence[str] = (),
    hours: float | None = None,
    target: Target = "labels",
) -> Options:
    """What every replay of a sweep is asked: ``whatif``'s defaults but the traces, the
    replay length and the target. Without flex traces or a backlog the replays take the
    bundled request traces (``build_whatif``), as ``gpupool whatif`` does."""
    return replace(
        DEMO,
        prod_trace=prod_trace,
        flex_traces=tuple(flex_traces),
        backlogs=tuple(backlogs),
        hours=hours,
        stack=StackOptions(target),
    )


def variant_document(policy: PoolPolicy, edits: Sequence[ValueEdit]) -> dict[str, Any]:
    """The policy as a plain document with ``edits`` applied."""
    document: dict[str, Any] = applied(policy.model_dump(mode="json", by_alias=True), edits)
    return document


def validated(policy: PoolPolicy, variants: Sequence[Variant]) -> list[Point | dict[str, Any]]:
    """Per variant, its document when it validates, else a ``Point`` saying why not."""
    out: list[Point | dict[str, Any]] = []
    for variant in variants:
        document = variant_document(policy, variant.edits)
        try:
            parse_policy(document, f"<variant {variant.name}>")
        except PolicyError as exc:
            reasons = "; ".join(p.message for p in exc.problems)
            out.append(Point(variant, problem=f"invalid: {reasons}"))
            continue
        out.append(document)
    return out


def run_sweep(
    policy: PoolPolicy,
    policy_dir: Path,
    variants: Sequence[Variant],
    options: Options,
    *,
    jobs: int,
    budget_s: float,
    ray_address: str | None = None,
    progress: SweepProgress | None = None,
) -> Sweep:
    """Replay ``variants`` (the current policy first) in ``jobs`` processes for at most
    ``budget_s`` seconds. Raises ``SweepError`` when the current policy's replay, the
    baseline of every comparison, did not finish in the budget."""
    if not variants or variants[0] != CURRENT:
        raise ValueError("a sweep starts with the current policy")
    start = time.monotonic()
    checked = validated(policy, variants)
    if isinstance(checked[0], Point):
        raise SweepError(f"the current policy does not validate: {checked[0].problem}")
    tasks = [
        _Task(i, doc, policy_dir, options, baseline=i == 0)
        for i, doc in enumerate(checked)
        if not isinstance(doc, Point)
    ]
    done: dict[int, Outcome] = {}
    with _pool(jobs, ray_address) as pool:
        results = pool.imap_unordered(_replay, tasks)
        for _ in tasks:
            left = budget_s - (time.monotonic() - start)
            try:
                index, outcome = results.next(timeout=max(left, 0.001))
            except multiprocessing.TimeoutError:
                break
            done[index] = outcome
            if progress is not None:
                progress(len(done), len(tasks))
    baseline = done.get(0)
    if not isinstance(baseline, Replayed) or baseline.fixed is None:
        why = baseline.why if isinstance(baseline, Failed) else f"did not finish in {budget_s:g} s"
        raise SweepError(
            f"the current policy's replay, the baseline of the sweep, {why}; "
            + ("raise --budget-s" if baseline is None else "fix the inputs")
        )
    points = [
        entry if isinstance(entry, Point) else _point(variants[i], done.get(i), budget_s)
        for i, entry in enumerate(checked)
    ]
    backend = "processes" if ray_address is None else f"ray {ray_address}"
    return Sweep(tuple(points), baseline.fixed, time.monotonic() - start, jobs, backend)


def _point(variant: Variant, outcome: Outcome | None, budget_s: float) -> Point:
    """The variant's point from its outcome; ``None``: the budget did not reach it."""
    if outcome is None:
        return Point(variant, problem=f"not reached in the {budget_s:g} s budget")
    if isinstance(outcome, Failed):
        return Point(variant, problem=f"replay failed: {outcome.why}")
    return Point(variant, outcome.pooled)


def _replay(task: _Task) -> tuple[int, Outcome]:
    """One variant in a worker process: its index and how its replay went."""
    try:
        policy = parse_policy(task.document, "<variant>")
        whatif = build_whatif(task.options, policy)
        if task.baseline:
            result = run(policy, task.policy_dir, whatif)
            return task.index, Replayed(result.pooled, result.fixed)
        return task.index, Replayed(run_pooled(policy, task.policy_dir, whatif), None)
    except Exception as exc:  # a worker reports every failure as data, never dies
        return task.index, Failed(f"{type(exc).__name__}: {exc}")


@contextmanager
def _pool(jobs: int, ray_address: str | None) -> Iterator[_Pool]:
    """A process pool, terminated on the way out (the budget's end or an interrupt)."""
    if ray_address is None:
        with _terminated(multiprocessing.get_context("spawn").Pool(jobs)) as pool:
            yield pool
        return
    try:
        import ray
        from ray.util.multiprocessing import Pool as RayPool
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'gpupool[ray]'") from None
    ray.init(address=ray_address, log_to_driver=False)
    try:
        with _terminated(RayPool(processes=jobs)) as pool:
            yield pool
    finally:
        ray.shutdown()


@contextmanager
def _terminated(pool: _Pool) -> Iterator[_Pool]:
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()
