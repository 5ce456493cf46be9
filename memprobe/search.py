"""The largest per-device batch, or the longest sequence, at which each strategy's step fits
a memory budget.

The search counts in steps ``n``: the per-device batch itself, or the sequence length in
attention blocks (``unit`` tokens each, so every length tried is one the model accepts). A
strategy's peak grows with either, roughly along a line (the parameters and optimizer state
are fixed, activations scale; the compiler's scheduling bends it: full-size E2B
``scan-checkpoint`` at seq 24576 needs 48.92 GiB at batch 2 and 50.09 at batch 3), so the
search needs few compiles:

1. n = 1 and 2, which give the line;
2. the n the line predicts to be the last that fits, and the one after it, together: when
   the first fits and the second does not, that is the answer;
3. otherwise a new line predicts again: through the two largest n while every one fits,
   through the nearest fitting and failing n once one fails. Once one has failed, a round
   whose prediction missed is followed by a plain halving of the interval, so the search
   ends in a few rounds even where the peak is far from linear.

With a host budget (``--host-ram``), a size fits only when its host bytes (what offload
puts in host memory) fit too; each round predicts from both lines and takes the smaller,
so whichever limit binds first decides.

No answer comes from the line alone: it is a size that was compiled and fits, with the
next size compiled and over (or the search limit reached). The search assumes that a
larger size never needs less memory; where a compiled larger one did need less, ``dips``
says so and the report shows it. Where such a dip crosses the budget (a size over, a
larger one fitting: full-size E2B ``scan-periods`` at batch 8 needs 102.44 GiB at seq
11776 and 93.20 at 12288), the search goes on above the larger one, since it is the
largest size known to fit, and ``over_below`` lists the smaller sizes that are over.
Every round compiles only sizes strictly between the largest that fits and the smallest
over above it, so no size is compiled twice and the search always ends. Nothing here
compiles or imports JAX; ``search`` is given a function that measures a set of sizes, and
``fit_plan`` (the search for a plan's strategies) a function that compiles a round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from memprobe.errors import BadInput
from memprobe.measure import (Measurement, host_ram_check, in_gib, parse_positive_size, with_host_ram)
from memprobe.model._config import attention_block_size, default_loss_chunks
from memprobe.plan import INT32_MAX, CompileJob, Plan, Shapes, check_tokens, sweep
from memprobe.result import TARGET_FIELDS, now

AXES = ("batch", "seq")  # what a fit varies: the per-device batch, or the sequence length


@dataclasses.dataclass
class StrategySearch:
    """One strategy's search: the sizes ``n`` compiled so far, their peaks and host bytes.

    ``n`` is the per-device batch (``axis`` "batch", ``unit`` 1) or the sequence length over
    ``unit`` tokens (``axis`` "seq"); ``value(n)`` is the batch or length itself.
    ``host_budget`` is the host bytes one device may hold (the host's RAM over the devices
    that share it); None when host memory is not judged."""

    strategy: str
    budget: int
    max_n: int
    peaks: dict[int, int] = dataclasses.field(default_factory=dict)
    hosts: dict[int, int] = dataclasses.field(default_factory=dict)
    host_budget: int | None = None
    axis: str = "batch"
    unit: int = 1
    # Sizes the TPU compiler refused over HBM ("Invalid TPU program" after running out of it):
    # over, with no peak; the bytes it said it needed.
    refused: dict[int, int] = dataclasses.field(default_factory=dict)
    error: str | None = None
    compiles: int = 0  # sizes measured, failed ones included
    rounds: int = 0
    _missed: bool = False

    def value(self, n: int) -> int:
        return n * self.unit

    def over(self, n: int) -> list[str]:
        """Which limits a compiled size exceeds: "HBM" (or the budget), "host RAM"; empty when it fits."""
        if n in self.refused:
            return ["HBM"]
        out = ["HBM"] if self.peaks[n] > self.budget else []
        if self.host_budget is not None and self.hosts.get(n, 0) > self.host_budget:
            out.append("host RAM")
        return out

    @property
    def largest(self) -> int:
        """The largest n compiled and fitting; 0 when n = 1 is over the budget."""
        return max((n for n in self.peaks if not self.over(n)), default=0)

    @property
    def smallest_over(self) -> int | None:
        """The smallest n compiled and over above ``largest``: the search stays between the two."""
        return min((n for n in self.compiled if n > self.largest and self.over(n)), default=None)

    @property
    def over_below(self) -> list[int]:
        """Compiled sizes under the answer that are over: a smaller size is not always smaller."""
        return sorted(n for n in self.compiled if n < self.largest and self.over(n))

    @property
    def compiled(self) -> list[int]:
        """Every size with an answer: a peak, or the compiler's refusal over HBM."""
        return [*self.peaks, *self.refused]

    @property
    def dips(self) -> list[tuple[int, int, str]]:
        """Where a compiled larger size needed less than the compiled size below it:
        (smaller n, larger n, "peak" or "host"). The search assumes there are none."""
        out = []
        for name, values in (("peak", self.peaks), ("host", self.hosts)):
            pairs = sorted(values.items())
            out += [(n1, n2, name) for (n1, v1), (n2, v2) in zip(pairs, pairs[1:]) if v2 < v1]
        return out

    @property
    def failed(self) -> bool:
        """The search stopped on an error (its ``error``): it answers nothing, though its
        peaks say what it compiled before."""
        return self.error is not None

    @property
    def done(self) -> bool:
        lo, hi = self.largest, self.smallest_over
        return self.failed or lo >= self.max_n or (hi is not None and hi == lo + 1)

    def next_sizes(self) -> list[int]:
        """The n to compile next (one or two); empty when the search is over."""
        if self.done:
            return []
        if not self.compiled:
            return [1, 2] if self.max_n >= 2 else [1]
        lo, hi = self.largest, self.smallest_over
        top = hi - 1 if hi is not None else self.max_n  # the largest n still open
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
            n1, n2 = lo, hi
        else:  # the two largest that fit (or compiled, when only one fits), every one of them at most lo
            fitting = sorted(n for n in self.peaks if not self.over(n))
            n1, n2 = fitting[-2:] if len(fitting) >= 2 else sorted(self.peaks)[-2:]
        # A refused size's line runs through what the compiler said it needed.
        limits = [({**self.refused, **self.peaks}, self.budget)]
        if self.host_budget is not None:
            limits.append((self.hosts, self.host_budget))
        guesses = [top]  # where nothing grows: try the far end
        for values, limit in limits:
            if n1 not in values or n2 not in values:  # no host bytes for a refused size
                continue
            slope = (values[n2] - values[n1]) / (n2 - n1)
            if slope > 0:
                guesses.append(n1 + int((limit - values[n1]) // slope))
        return min(guesses)

    def record(self, n: int, m: Measurement) -> None:
        self.compiles += 1
        if m.refused:
            self.refused[n] = m.needed_bytes
            return
        if not m.ok:  # the first failure says most
            self.error = self.error or f"{self.axis} {self.value(n)}: {m.error}"
            return
        self.peaks[n] = m.peak_bytes
        self.hosts[n] = m.host_bytes

    def end_round(self) -> None:
        self.rounds += 1
        # The first round only draws the line; a later one that did not settle it missed.
        self._missed = self.rounds > 1 and not self.done and not self._missed


Measure = Callable[[list[tuple[str, int]]], list[Measurement]]


def search(strategies: list[str], budget: int, max_n: int, measure: Measure, host_budget: int | None = None,
           axis: str = "batch", unit: int = 1) -> list[StrategySearch]:
    """Runs every strategy's search, one round of compiles at a time (all strategies' sizes
    of a round are measured together, so they compile in parallel). ``measure`` is given
    (strategy, n) pairs."""
    searches = [StrategySearch(s, budget, max_n, host_budget=host_budget, axis=axis, unit=unit)
                for s in strategies]
    while True:
        wanted = [(s, n) for s in searches for n in s.next_sizes()]
        if not wanted:
            return searches
        for (s, n), m in zip(wanted, measure([(s.strategy, n) for s, n in wanted]), strict=True):
            s.record(n, m)
        for s in {id(s): s for s, _ in wanted}.values():
            s.end_round()


#: The ``schema`` of a saved fit, and of the fits of a sweep saved together.
FIT_SCHEMA = "memprobe.fit"  # one fit
FITS_SCHEMA = "memprobe.fits"  # several fits of one sweep (--seq 8192,24576) in one file


@dataclasses.dataclass
class FitResult:
    """A finished search: one ``StrategySearch`` per strategy, every measurement it compiled,
    the budget searched against and where it came from, and the host RAM judged (if any).
    ``axis`` is what was searched ("batch" or "seq"), in steps of ``unit`` (tokens for seq)."""

    searches: list[StrategySearch]
    measurements: list[Measurement]
    budget: int
    budget_source: str  # "HBM" (the target's per device) or "--budget"
    max_n: int
    command: str | None = None
    created: str | None = None  # when the search ended (ISO-8601 UTC); None: now, when written
    host_ram: int | None = None  # --host-ram: one host's RAM, shared by devices_per_host devices
    devices_per_host: int | None = None
    axis: str = "batch"
    unit: int = 1

    @property
    def host_budget(self) -> int | None:
        """Host bytes one device may hold: host bytes x devices per host <= host RAM exactly
        when host bytes <= this."""
        if self.host_ram is None or self.devices_per_host is None:
            return None
        return self.host_ram // self.devices_per_host

    @property
    def held(self) -> tuple[str, int]:
        """The shape the search held fixed: ("seq", the length) for a batch search, ("batch",
        the per-device batch) for a length search."""
        m = self.measurements[0]
        return ("seq", m.seq_len) if self.axis == "batch" else ("batch", m.batch_per_device)

    def answers(self) -> dict[str, int | None]:
        """Per strategy, the largest batch (or length in tokens) compiled and fitting: 0 when
        even the smallest is over, None when its search failed."""
        return {s.strategy: None if s.failed else s.value(s.largest) for s in self.searches}

    def ranked(self) -> list[StrategySearch]:
        """Largest size first; among equals, the lower peak at it; failed searches last."""
        def key(s: StrategySearch):
            return (s.failed, -s.largest, s.peaks.get(s.largest, 0))
        return sorted(self.searches, key=key)

    def to_json(self) -> dict:
        from memprobe.result import Result

        a, rows = self.axis, []
        for s in self.ranked():
            # A failed search answers nothing (null), though its peaks say what it compiled.
            failed = s.failed
            hi = None if failed else s.smallest_over
            rows.append({"strategy": s.strategy, f"largest_{a}": None if failed else s.value(s.largest),
                         "peak_bytes": None if failed else s.peaks.get(s.largest),
                         "host_bytes": None if failed else s.hosts.get(s.largest),
                         f"next_{a}": s.value(hi) if hi is not None else None,
                         # a refused size's: the compiler's total, as its measurement's peak
                         "next_peak_bytes": s.peaks.get(hi, s.refused.get(hi)) if hi is not None else None,
                         "next_host_bytes": s.hosts.get(hi) if hi is not None else None,
                         "next_over": s.over(hi) if hi is not None else [],
                         "limit_reached": not failed and s.largest >= s.max_n, "error": s.error,
                         "compiles": s.compiles,
                         "peaks": {str(s.value(n)): p for n, p in sorted(s.peaks.items())},
                         "refused": {str(s.value(n)): b for n, b in sorted(s.refused.items())},
                         "hosts": {str(s.value(n)): h for n, h in sorted(s.hosts.items())},
                         "dips": [{a: s.value(n1), f"larger_{a}": s.value(n2), "of": what}
                                  for n1, n2, what in s.dips],
                         "over_below": [s.value(n) for n in s.over_below]})
        result = Result(self.measurements, command=self.command,
                        **({"created": self.created} if self.created else {})).to_json()
        return {"schema": FIT_SCHEMA, "schema_version": 1, "created": result["created"],
                "command": self.command, "axis": a, **({"seq_unit": self.unit} if a == "seq" else {}),
                "budget_bytes": self.budget, "budget_source": self.budget_source,
                f"max_{a}": self.max_n * self.unit, "host_ram_bytes": self.host_ram,
                "devices_per_host": self.devices_per_host, "rows": rows, "result": result}

    def save(self, path: str | Path) -> None:
        """Writes the JSON `memprobe fit --format json` writes: what ``memprobe.load`` and
        `memprobe report` read back."""
        from memprobe.result import save_json

        save_json(path, self.to_json(), "found", ("table", "markdown"), chart=False)

    @classmethod
    def from_json(cls, data: dict, where: str = "result") -> FitResult:
        """Reads what ``to_json`` wrote; anything malformed is refused in one line."""
        from memprobe.errors import BadInput
        from memprobe.result import Result

        try:
            axis = data.get("axis", "batch")  # results from before seq searches have no axis
            if axis not in AXES:
                raise ValueError(f"axis {axis!r} is neither batch nor seq")
            unit = int(data["seq_unit"]) if axis == "seq" else 1
            budget, max_n = int(data["budget_bytes"]), int(data[f"max_{axis}"]) // unit
            ram, per_host = (None if data.get(k) is None else int(data[k])
                             for k in ("host_ram_bytes", "devices_per_host"))
            result = Result.from_json(data.get("result"), f"{where}: result")  # its own one-line errors
            fit = cls([], result.measurements, budget, str(data["budget_source"]), max_n,
                      command=data.get("command"), created=data.get("created"), host_ram=ram,
                      devices_per_host=per_host, axis=axis, unit=unit)
            for row in data["rows"]:
                # Results written before host bytes were kept have them only in the measurements.
                hosts = row.get("hosts") or {m.seq_len if axis == "seq" else m.batch_per_device: m.host_bytes
                                             for m in result.measurements if m.strategy == row["strategy"] and m.ok}
                fit.searches.append(StrategySearch(
                    row["strategy"], budget, max_n, peaks={int(v) // unit: int(p) for v, p in row["peaks"].items()},
                    hosts={int(v) // unit: int(h) for v, h in hosts.items()}, host_budget=fit.host_budget,
                    refused={int(v) // unit: int(b) for v, b in row.get("refused", {}).items()},
                    axis=axis, unit=unit, error=row["error"], compiles=int(row["compiles"])))
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            raise BadInput(f"{where}: not a memprobe fit result ({type(e).__name__}: {e})") from None
        return fit


def fits_to_json(fits: list[FitResult]) -> dict:
    """One fit as its own JSON (``FitResult.to_json``); the fits of a sweep, one per shape, in
    one container."""
    if len(fits) == 1:
        return fits[0].to_json()
    parts = [f.to_json() for f in fits]
    return {"schema": FITS_SCHEMA, "schema_version": 1, "created": parts[0]["created"],
            "command": fits[0].command, "axis": fits[0].axis, "fits": parts}


def fits_from_json(data: dict, where: str = "result") -> list[FitResult]:
    """Reads what ``fits_to_json`` wrote; anything malformed is refused in one line."""
    if data.get("schema") != FITS_SCHEMA:
        return [FitResult.from_json(data, where)]
    listed = data.get("fits")
    if not isinstance(listed, list) or not listed or not all(isinstance(d, dict) for d in listed):
        raise BadInput(f"{where}: fits: expected a non-empty list of fit results")
    fits = [FitResult.from_json(d, f"{where}: fits[{i}]") for i, d in enumerate(listed)]
    if len({(f.axis, f.unit) for f in fits}) > 1:
        raise BadInput(f"{where}: fits: the fits of one sweep must search the same axis")
    return fits


def fit_target(f: FitResult) -> tuple:
    """The slice a fit searched on (target, platform, devices, topology): what tells the fits
    of a sweep on several targets apart."""
    m = f.measurements[0]
    return tuple(getattr(m, k) for k in TARGET_FIELDS)


def merge_fits(loaded: list[tuple[str, list[FitResult]]]) -> list[FitResult]:
    """Saved fits (file, its fits) as one sweep: they must differ in the shape held fixed, the
    target, or both, and in nothing else (the same search, host RAM and setting; the same
    ``--budget``, or each its target's HBM), each target and shape once. Targets in the order
    first seen, each target's shortest or smallest shape first; anything else is refused in
    one line naming the file."""
    from memprobe.result import SHAPE_FIELDS, setting_of

    fits = [(where, f) for where, listed in loaded for f in listed]
    if len(fits) == 1:
        return [fits[0][1]]

    def what(f: FitResult) -> dict:
        return {"search": (f.axis, f.unit, f.max_n), "host RAM": f.host_ram,
                "budget": f.budget_source if f.budget_source == "HBM" else (f.budget, f.budget_source),
                **setting_of(f.measurements[0], SHAPE_FIELDS + TARGET_FIELDS)}

    (first_where, first), seen, sharing = fits[0], {}, {}
    expected, targets = what(first), list(dict.fromkeys(fit_target(f) for _, f in fits))
    for where, f in fits:
        shape = "length" if f.held[0] == "seq" else "batch"
        differs = [k for k, v in what(f).items() if v != expected[k]]
        if differs:
            raise BadInput(f"{where}: its {differs[0]} differs from {first_where}'s: fit results merge only when "
                           f"they differ in the {shape}, the target or both")
        # Targets may share a host among different numbers of devices; one target's fits may not.
        other, per_host = sharing.setdefault(fit_target(f), (where, f.devices_per_host))
        if f.devices_per_host != per_host:
            raise BadInput(f"{where}: its devices per host ({f.devices_per_host}) differ from {other}'s "
                           f"({per_host}) on the same target: fit results merge only when they differ in the "
                           f"{shape}, the target or both")
        key = (fit_target(f), f.held)
        if key in seen:
            m = f.measurements[0]
            on = (f" on {m.topology or m.target} ({m.num_devices} device{'s' if m.num_devices != 1 else ''})"
                  if len(targets) > 1 else "")
            raise BadInput(f"{where}: {' '.join(map(str, f.held))}{on} is in {seen[key]} too")
        seen[key] = where
    return sorted((f for _, f in fits), key=lambda f: (targets.index(fit_target(f)), f.held[1]))


#: Compiles one round of a fit: (jobs, their labels, a line saying what they are) -> measurements.
RoundRunner = Callable[[list[CompileJob], list[str], str], list[Measurement]]

DEFAULT_MAX_BATCH = 1024
DEFAULT_MAX_SEQ = 131072  # Gemma 4 small's context length
DEFAULT_FIT_SEQ = 24576


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a fit on one target searches against, checked before the first compile: the
    per-device budget and where it came from ("HBM" or "--budget"), and with --host-ram the
    host's RAM and the devices sharing it."""

    budget: int
    source: str
    host_ram: int | None = None
    devices_per_host: int | None = None


def fit_limits(plan: Plan, budget: str | int | None = None, host_ram: str | int | None = None,
               devices_per_host: int | None = None) -> Limits:
    """``plan``'s target's limits for a fit: ``budget`` (a size, bytes, or None for the
    target's HBM) and the host RAM; refused in one line where the target has no HBM and no
    budget is given, or no host memory to judge host RAM by."""
    if budget is not None:
        limit = parse_positive_size(budget, "--budget") if isinstance(budget, str) else budget
        if limit < 1:
            raise BadInput(f"--budget must be a positive size, got {budget}")
        source = "--budget"
    elif plan.target.hbm_bytes is None:
        raise BadInput(f"target {plan.target.name} has no HBM capacity to fit in; pass --budget SIZE")
    else:
        limit, source = plan.target.hbm_bytes, "HBM"
    ram, per_host = host_ram_check(plan.target, host_ram, devices_per_host) or (None, None)
    return Limits(limit, source, ram, per_host)


def held_by(plan: Plan, axis: str) -> str:
    """The shape a search along ``axis`` holds fixed on ``plan``: "seq 8192" for a batch
    search, "batch 8" for a length search."""
    return f"seq {plan.shapes.seq_len}" if axis == "batch" else f"batch {plan.shapes.batch_per_device}"


def fit_plan(plan: Plan, axis: str, unit: int, max_n: int, runner: RoundRunner, limits: Limits, *,
             at: str = "") -> FitResult:
    """The search of ``fit`` on a checked plan, whose shapes give what stays fixed; ``max_n``
    sizes of ``unit`` along ``axis`` at most (see ``search_axis``), against ``limits`` (see
    ``fit_limits``). ``at`` names what varies in a sweep in progress labels ("seq 8192",
    "h100 (8 devices)")."""
    by_name = {s.name: s for s in plan.strategies}
    measured: list[Measurement] = []
    rounds = 0

    def shapes(n: int) -> Shapes:
        if axis == "batch":
            return Shapes(plan.shapes.seq_len, n, plan.shapes.loss_chunks)
        return Shapes(n * unit, plan.shapes.batch_per_device, default_loss_chunks(n * unit))

    def measure(pairs: list[tuple[str, int]]) -> list[Measurement]:
        nonlocal rounds
        rounds += 1
        wanted = [plan.job(by_name[name], shapes(n)) for name, n in pairs]
        sizes = ("batch size" if axis == "batch" else "sequence length") + ("s" if len(pairs) != 1 else "")
        what = (f"{len(pairs)} {sizes} for {plan.model.name} on {plan.target.label} at {held_by(plan, axis)} "
                f"(round {rounds}, budget {in_gib(limits.budget)[0]})")
        out = runner(wanted, [f"{name} {axis} {n * unit}{f' @ {at}' if at else ''}" for name, n in pairs], what)
        if limits.host_ram is not None:
            out = with_host_ram(out, limits.host_ram, limits.devices_per_host)
        measured.extend(out)
        return out

    result = FitResult([], measured, limits.budget, limits.source, max_n, host_ram=limits.host_ram,
                       devices_per_host=limits.devices_per_host, axis=axis, unit=unit)
    result.searches = search(list(by_name), limits.budget, max_n, measure, result.host_budget, axis, unit)
    result.created = now()  # when the search ended: every save of it says the same
    return result


def fit_sweep(plans: list[Plan], axis: str, unit: int, max_n: int, runner: RoundRunner, fixed: list[int],
              loss_chunks: int | None = None, *, budget: str | int | None = None,
              host_ram: str | int | None = None, devices_per_host: int | None = None) -> list[FitResult]:
    """``fit_plan`` on each target's plan of ``plans`` (targets outer, in the order given) at
    each value of the shape the search holds fixed: the length for a batch search (--seq
    8192,24576), the batch for a length search. Every target's limits and every shape are
    checked before the first compile."""
    checked = [(p, fit_limits(p, budget, host_ram, devices_per_host)) for p in plans]
    swept = []
    for plan, limits in checked:
        seqs, batches = ((fixed, [plan.shapes.batch_per_device]) if axis == "batch"
                         else ([plan.shapes.seq_len], fixed))
        swept += [(p, limits) for p in sweep(plan, seqs, batches, loss_chunks)]
    for p, _ in swept:  # the largest size searched must be a step XLA can shape, too
        if axis == "batch":
            check_tokens(p.shapes.seq_len, max_n, p.target.num_devices, p.grad_accum, f"--max-batch {max_n}")
        else:
            check_tokens(max_n * unit, p.shapes.batch_per_device, p.target.num_devices, p.grad_accum,
                         f"--max-seq {max_n * unit}")

    def at(p: Plan) -> str:
        where = [p.target.label] if len(plans) > 1 else []
        if len(fixed) > 1:
            where.append(held_by(p, axis))
        return " @ ".join(where)
    return [fit_plan(p, axis, unit, max_n, runner, limits, at=at(p)) for p, limits in swept]


def search_axis(vary: str, seq: int | None, batch: int | None, max_batch: int | None, max_seq: int | None,
                 loss_chunks: int | None) -> tuple[str, int, int, int, int]:
    """What the search varies, in which steps and up to where, and the shape it holds fixed:
    (axis, unit, largest n, seq and batch to plan with). Options that belong to the other
    axis are refused rather than ignored."""
    if vary == "batch":
        for flag, value in (("--batch", batch), ("--max-seq", max_seq)):
            if value is not None:
                raise BadInput(f"{flag} applies with --vary seq; --vary batch searches the batch at --seq")
        max_n = DEFAULT_MAX_BATCH if max_batch is None else max_batch
        if max_n < 1:
            raise BadInput(f"--max-batch must be a positive integer, got {max_n}")
        return "batch", 1, max_n, DEFAULT_FIT_SEQ if seq is None else seq, 1
    for flag, value in (("--seq", seq), ("--max-batch", max_batch), ("--loss-chunks", loss_chunks)):
        if value is not None:
            raise BadInput(f"{flag} does not apply with --vary seq, which searches the length "
                           "(up to --max-seq, the loss in chunks of one attention block)")
    unit = attention_block_size(DEFAULT_MAX_SEQ)
    longest = DEFAULT_MAX_SEQ if max_seq is None else max_seq
    if longest < unit or longest % unit:
        raise BadInput(f"--max-seq must be a positive multiple of the attention block ({unit}), got {longest}")
    if longest > INT32_MAX:
        raise BadInput(f"--max-seq {longest}: over {INT32_MAX:,}, the longest sequence whose positions JAX's "
                       "default integer (int32) can number")
    return "seq", unit, longest // unit, unit, 1 if batch is None else batch
