"""The time budget of a one-shot device check (bench/compaction_gpu.py,
bench/preservation_gpu.py): one deadline for the whole run, waits bounded by what is left of
it, progress lines stamped with the time spent. A device slot is minutes long and is gone
when it ends, so a check must stop in time and say where it was."""

from __future__ import annotations

import time


class Budget:
    """One deadline, ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        """Seconds to the deadline (negative past it)."""
        return self.deadline - time.monotonic()

    def left(self, bound: float) -> float:
        """A wait's bound: the smaller of its own and what is left (at least 1 s)."""
        return max(1.0, min(bound, self.remaining()))

    def check(self, step: int) -> None:
        """A generation's per-step hook: raise ``TimeoutError`` once the deadline passed."""
        if self.remaining() <= 0:
            raise TimeoutError(f"the budget of {self.seconds:g} s ran out at step {step}")


def say(budget: Budget, message: str) -> None:
    """One progress line, stamped with the seconds spent."""
    print(f"[{budget.elapsed():6.1f} s] {message}", flush=True)
