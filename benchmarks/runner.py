"""The interleaved runner: every round runs every case once, in a fresh random order.

One run, many rounds, all cases interleaved, so a noisy neighbour (two cores, other engineers'
tests) slows every case alike and the ratios stay meaningful. Sync cases are called directly
and async cases awaited on the same event loop; each sample is the wall time of one call.
"""

from __future__ import annotations

import gc
import inspect
import math
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .cases import Case

__all__ = ["STOP", "Interrupted", "Summary", "run_interleaved", "summarize"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the run stops where it is, and its finally blocks clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Stop:
    """A stop a signal asked for. Inside the interleaved rounds the signal handler only records
    it and the loop raises at the next round: an exception raised at whatever bytecode the
    rounds were at could land in asyncio's own machinery, which turned it into a cancellation
    that ``asyncio.wait_for`` (Python 3.11) can swallow, and the run went on to its last round."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)


STOP = _Stop()


@dataclass(frozen=True, slots=True)
class Summary:
    """Latency statistics of one case, in nanoseconds."""

    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    min: float

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "p50": self.p50, "p90": self.p90, "p99": self.p99,
                "mean": self.mean, "min": self.min}  # fmt: skip


def _quantile(ordered: Sequence[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: Sequence[int]) -> Summary:
    ordered = sorted(samples)
    return Summary(
        n=len(ordered),
        p50=_quantile(ordered, 0.50),
        p90=_quantile(ordered, 0.90),
        p99=_quantile(ordered, 0.99),
        mean=sum(ordered) / len(ordered) if ordered else math.nan,
        min=float(ordered[0]) if ordered else math.nan,
    )


async def prepare_all(cases: Sequence[Case]) -> None:
    for case in cases:
        if case.prepare is not None:
            result = case.prepare()
            if inspect.isawaitable(result):
                await result


async def run_interleaved(
    cases: Sequence[Case],
    rounds: int,
    *,
    warmup: int,
    first_index: int = 0,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> dict[str, list[int]]:
    """Run ``warmup + rounds`` rounds; return the samples (ns) of the last ``rounds`` per case.

    Round ``r`` calls ``case.run(first_index + r)``, so first-call cases get a fresh key from
    the index each round.
    """
    rng = random.Random(seed)
    order = list(cases)
    samples: dict[str, list[int]] = {case.name: [] for case in cases}
    clock = time.perf_counter_ns
    gc.collect()
    gc.freeze()  # setup garbage is not the cases' to collect
    STOP.deferred = True
    try:
        for r in range(warmup + rounds):
            STOP.check()
            rng.shuffle(order)
            keep = r >= warmup
            index = first_index + r
            for case in order:
                if case.is_async:
                    t0 = clock()
                    await case.run(index)
                    elapsed = clock() - t0
                else:
                    t0 = clock()
                    case.run(index)
                    elapsed = clock() - t0
                if keep:
                    samples[case.name].append(elapsed)
            if progress is not None and r % 100 == 0:
                progress(r)
    finally:
        STOP.deferred = False
        gc.unfreeze()
    STOP.check()  # a signal during the last round
    return samples
