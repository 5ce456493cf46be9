"""The largest per-device batch at which each strategy's step fits a memory budget.

A strategy's peak grows with the batch, roughly along a line (the parameters and optimizer
state are fixed, activations scale; the compiler's scheduling bends it: full-size E2B
``scan-checkpoint`` at seq 24576 needs 48.92 GiB at batch 2 and 50.09 at batch 3), so the
search needs few compiles:

1. batch 1 and 2, which give the line;
2. the batch the line predicts to be the last that fits, and the one after it, together:
   when the first fits and the second does not, that is the answer;
3. otherwise a new line predicts again: through the two largest batches while every batch
   fits, through the nearest fitting and failing batches once one fails. Once a batch has
   failed, a round whose prediction missed is followed by a plain halving of the interval,
   so the search ends in a few rounds even where the peak is far from linear.

No batch is reported from the line alone: the answer is a batch that was compiled and
fits, with the next batch compiled and over (or the search limit reached). The search
assumes only that a larger batch never needs less memory. Nothing here compiles or imports
JAX; ``search`` is given a function that measures a set of batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from memprobe.measure import Measurement


@dataclasses.dataclass
class StrategySearch:
    """One strategy's search: the batches compiled so far and their peaks."""

    strategy: str
    budget: int
    max_batch: int
    peaks: dict[int, int] = dataclasses.field(default_factory=dict)
    error: str | None = None
    compiles: int = 0  # batches measured, failed ones included
    rounds: int = 0
    _missed: bool = False

    @property
    def largest(self) -> int:
        """The largest batch compiled and fitting; 0 when batch 1 is over the budget."""
        return max((b for b, p in self.peaks.items() if p <= self.budget), default=0)

    @property
    def smallest_over(self) -> int | None:
        return min((b for b, p in self.peaks.items() if p > self.budget), default=None)

    @property
    def done(self) -> bool:
        lo, hi = self.largest, self.smallest_over
        return self.error is not None or lo >= self.max_batch or (hi is not None and hi == lo + 1)

    def next_batches(self) -> list[int]:
        """The batches to compile next (one or two); empty when the search is over."""
        if self.done:
            return []
        if not self.peaks:
            return [1, 2] if self.max_batch >= 2 else [1]
        lo, hi = self.largest, self.smallest_over
        top = hi - 1 if hi is not None else self.max_batch  # the largest batch still open
        if top == lo + 1:
            return [top]
        if self._missed and hi is not None:
            guess = (lo + top + 1) // 2
        else:
            guess = self._predicted(lo, hi, top)
        guess = min(max(guess, lo + 1), top - 1)
        return [guess, guess + 1]

    def _predicted(self, lo: int, hi: int | None, top: int) -> int:
        if hi is not None:
            (b1, p1), (b2, p2) = (lo, self.peaks[lo]), (hi, self.peaks[hi])
        else:  # the two largest batches compiled, all fitting
            (b1, p1), (b2, p2) = sorted(self.peaks.items())[-2:]
        slope = (p2 - p1) / (b2 - b1)
        if slope <= 0:  # no growth seen: try the far end
            return top
        return b1 + int((self.budget - p1) // slope)

    def record(self, batch: int, m: Measurement) -> None:
        self.compiles += 1
        if not m.ok:
            self.error = self.error or f"batch {batch}: {m.error}"  # the first failure says most
            return
        self.peaks[batch] = m.peak_bytes

    def end_round(self) -> None:
        self.rounds += 1
        # The first round only draws the line; a later one that did not settle it missed.
        self._missed = self.rounds > 1 and not self.done and not self._missed


Measure = Callable[[list[tuple[str, int]]], list[Measurement]]


def search(strategies: list[str], budget: int, max_batch: int, measure: Measure) -> list[StrategySearch]:
    """Runs every strategy's search, one round of compiles at a time (all strategies' batches
    of a round are measured together, so they compile in parallel)."""
    searches = [StrategySearch(s, budget, max_batch) for s in strategies]
    while True:
        wanted = [(s, b) for s in searches for b in s.next_batches()]
        if not wanted:
            return searches
        for (s, b), m in zip(wanted, measure([(s.strategy, b) for s, b in wanted]), strict=True):
            s.record(b, m)
        for s in {id(s): s for s, _ in wanted}.values():
            s.end_round()


@dataclasses.dataclass
class FitResult:
    """A finished search: one ``StrategySearch`` per strategy, every measurement it compiled,
    the budget searched against and where it came from."""

    searches: list[StrategySearch]
    measurements: list[Measurement]
    budget: int
    budget_source: str  # "HBM" (the target's per device) or "--budget"
    max_batch: int
    command: str | None = None
    created: str | None = None  # when the search ran (ISO-8601 UTC); now, if not read back

    def ranked(self) -> list[StrategySearch]:
        """Largest batch first; among equals, the lower peak at it; failed searches last."""
        def key(s: StrategySearch):
            return (s.error is not None, -s.largest, s.peaks.get(s.largest, 0))
        return sorted(self.searches, key=key)

    def to_json(self) -> dict:
        from memprobe.result import Result

        rows = []
        for s in self.ranked():
            hi = s.smallest_over
            rows.append({"strategy": s.strategy, "largest_batch": s.largest,
                         "peak_bytes": s.peaks.get(s.largest), "next_batch": hi,
                         "next_peak_bytes": s.peaks.get(hi) if hi is not None else None,
                         "limit_reached": s.largest >= s.max_batch, "error": s.error, "compiles": s.compiles,
                         "peaks": {str(b): p for b, p in sorted(s.peaks.items())}})
        result = Result(self.measurements, command=self.command,
                        **({"created": self.created} if self.created else {})).to_json()
        return {"schema": "memprobe.fit", "schema_version": 1, "created": result["created"],
                "command": self.command, "budget_bytes": self.budget, "budget_source": self.budget_source,
                "max_batch": self.max_batch, "rows": rows, "result": result}

    @classmethod
    def from_json(cls, data: dict, where: str = "result") -> FitResult:
        """Reads what ``to_json`` wrote; anything malformed is refused in one line."""
        from memprobe.errors import BadInput
        from memprobe.result import Result

        try:
            budget, max_batch = int(data["budget_bytes"]), int(data["max_batch"])
            searches = [StrategySearch(row["strategy"], budget, max_batch,
                                       peaks={int(b): int(p) for b, p in row["peaks"].items()}, error=row["error"],
                                       compiles=int(row["compiles"]))
                        for row in data["rows"]]
            source = str(data["budget_source"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BadInput(f"{where}: not a memprobe fit result ({type(e).__name__}: {e})") from None
        result = Result.from_json(data.get("result"), f"{where}: result")
        return cls(searches, result.measurements, budget, source, max_batch, command=data.get("command"),
                   created=data.get("created"))
