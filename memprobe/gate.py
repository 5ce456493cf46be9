"""The regression gate: a baseline's figures, a tolerance and a budget in, a verdict per
strategy out. `memprobe check` and ``memprobe.check`` are built on it."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from memprobe.compile import GPU_PACKAGES, versions
from memprobe.errors import BadInput
from memprobe.measure import Measurement, in_gib, parse_positive_size, parse_size
from memprobe.model_file import model_from_mapping
from memprobe.plan import Plan, make_plan, recipe
from memprobe.result import Result, config_key, read_json
from memprobe.strategy import strategy_from_mapping
from memprobe.targets import require_backend, resolve_target

_BARE_NUMBER = re.compile(r"[0-9]*\.?[0-9]+")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    relative: float | None = None  # 0.02 for 2%
    absolute_bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        t = text.strip()
        if t.endswith("%"):
            try:
                value = float(t[:-1])
            except ValueError:
                value = -1.0
            if not 0 <= value < math.inf:  # nan% and inf% too: no figure is within either
                raise BadInput(f"--tolerance: {text!r} is not a percentage like 2%")
            return cls(relative=value / 100)
        if _BARE_NUMBER.fullmatch(t):  # 2 meant as 2% would be a 2-byte gate: say which
            raise BadInput(f"--tolerance: {text!r} has no unit: a percentage like {t}%, or a size like {t}GiB "
                           f"({t}B for bytes)")
        try:
            size = parse_size(t, "--tolerance")
        except BadInput:  # neither: name both forms a tolerance takes
            raise BadInput(f"--tolerance: {text!r} is not a percentage like 2% or a size like 0.5GiB") from None
        return cls(absolute_bytes=size)

    def allowed(self, base_bytes: int) -> int:
        if self.relative is not None:
            return int(base_bytes * self.relative)
        return self.absolute_bytes or 0

    def __str__(self) -> str:
        if self.relative is not None:
            return f"{self.relative * 100:g}%"
        return in_gib(self.absolute_bytes or 0)[0]


@dataclasses.dataclass(frozen=True)
class Verdict:
    base: Measurement
    now: Measurement
    # "ok", "improved", "regressed", "over budget", "host regressed", "refused" (the TPU compiler
    # refused the program over HBM), "failed"
    status: str

    @property
    def passed(self) -> bool:
        return self.status in ("ok", "improved")


def judge(base: Measurement, now: Measurement, tolerance: Tolerance, max_peak: int | None) -> Verdict:
    if not now.ok:
        return Verdict(base, now, "refused" if now.refused else "failed")
    allowed = tolerance.allowed(base.peak_bytes)
    if now.peak_bytes > base.peak_bytes + allowed:
        return Verdict(base, now, "regressed")
    if max_peak is not None and now.peak_bytes > max_peak:
        return Verdict(base, now, "over budget")
    # Offload can trade HBM for host memory: a peak that held or fell must not hide host
    # bytes that grew (from none, any growth is beyond a relative tolerance).
    if now.host_bytes > base.host_bytes + tolerance.allowed(base.host_bytes):
        return Verdict(base, now, "host regressed")
    if now.peak_bytes < base.peak_bytes - allowed:
        return Verdict(base, now, "improved")
    return Verdict(base, now, "ok")


def configuration(b: Measurement) -> str:
    """A baseline row's configuration in a few words, as the gate's table names it."""
    where = f"{b.model} seq {b.seq_len} x {b.batch_per_device} on {b.topology or b.target}"
    if b.step != "train" or b.optimizer != "adamw" or b.param_dtype != "fp32" or b.grad_accum != 1:
        where += f", {b.step} step ({recipe(b.step, b.optimizer, b.param_dtype, b.grad_accum)})"
    return where


def _read_result(path: Path, role: str) -> Result:
    """A comparison result to gate with; another kind of memprobe file (a fit, an explain
    answer, check's own verdicts) is named as such."""
    from memprobe.liveness import EXPLAIN_SCHEMA
    from memprobe.search import FIT_SCHEMA, FITS_SCHEMA

    data = read_json(Path(path))
    others = {FIT_SCHEMA: "a fit result", FITS_SCHEMA: "fit results", EXPLAIN_SCHEMA: "an explain result",
              CHECK_SCHEMA: "check's verdicts"}  # what memprobe writes that is no comparison
    kind = others.get(data.get("schema") if isinstance(data, dict) else None)
    if kind:
        raise BadInput(f"{path}: {kind}, not {role}; `memprobe baseline` writes one (as does compare's "
                       "--format json)")
    return Result.from_json(data, str(path))


def load_current(paths: str | Path | Sequence[str | Path]) -> tuple[str, Result]:
    """Saved results to judge against a baseline instead of recompiling (`check --current`),
    named for the verdicts, and merged as `memprobe report` merges them: the strategies of one
    configuration compiled in several jobs are one comparison (one strategy in two files, or
    one configuration compiled by two compiler versions, is refused). Failed rows are
    verdicts like any recompile's."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise BadInput("current: an empty list; give the result files to judge")
    loaded = [(str(p), _read_result(Path(p), "a result to judge")) for p in paths]
    return ", ".join(where for where, _ in loaded), Result.merge(loaded)


def load_baseline(path: Path, allow_version_drift: bool = False) -> Result:
    """A baseline fit to gate against: whole, and compiled with this machine's compiler
    versions unless ``allow_version_drift``. Another kind of memprobe file (a fit, an explain
    answer, check's own verdicts) is named as such."""
    base = _read_result(path, "a baseline")
    if not all(m.ok for m in base.measurements):
        raise BadInput(f"{path}: the baseline has failed rows; write it again with `memprobe baseline`")
    if not allow_version_drift:
        check_versions(base, Path(path))
    return base


def baseline_plans(base: Result, where: Path) -> list[tuple[list[Measurement], Plan]]:
    """Each configuration of the baseline with the plan that compiles it again: the same
    model, target, shapes, step and strategy knobs as recorded."""
    plans = []
    for group in base.comparisons:
        m0 = group[0]
        strategies = [strategy_from_mapping(m.strategy, {"description": "from the baseline", **m.strategy_knobs},
                                            f"{where}: {m.strategy}") for m in group]
        target = resolve_target(m0.target, m0.num_devices, m0.topology if m0.platform != "cpu" else None)
        require_backend(target)
        try:
            model = (m0.model if m0.model_config is None
                     else model_from_mapping(m0.model, m0.model_config, f"model {m0.model!r}"))
            plan = make_plan(model=model, strategies=strategies, target=target, seq_len=m0.seq_len,
                             batch_per_device=m0.batch_per_device, loss_chunks=m0.loss_chunks,
                             step=m0.step, optimizer=m0.optimizer, param_dtype=m0.param_dtype,
                             grad_accum=m0.grad_accum)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        plans.append((group, plan))
    return plans


def limits(tolerance: str | Tolerance, max_peak: str | int | None) -> tuple[Tolerance, int | None]:
    """--tolerance ("2%", "0.5GiB") and --max-peak ("90GiB", or bytes) as the gate uses them."""
    tol = tolerance if isinstance(tolerance, Tolerance) else Tolerance.parse(tolerance)
    if isinstance(max_peak, str):
        max_peak = parse_positive_size(max_peak, "--max-peak")
    elif max_peak is not None and max_peak <= 0:  # a budget no program meets would fail every gate
        raise BadInput(f"--max-peak must be a positive size, got {max_peak!r}")
    return tol, max_peak


def recheck(base: Result, where: Path, tolerance: Tolerance, max_peak: int | None,
            compile_plans: Callable[[list[Plan]], list[Measurement]]) -> Checked:
    """Every configuration of the baseline compiled again by ``compile_plans`` (all of them
    planned before the first compile, and compiled in one pool, so a sweep's shapes compile
    side by side) and judged, one verdict per strategy."""
    planned = baseline_plans(base, where)
    now = iter(compile_plans([plan for _, plan in planned]))
    return Checked([judge(b, next(now), tolerance, max_peak) for group, _ in planned for b in group],
                   tolerance, max_peak, where)


#: A row's fields that say what was compiled (the rest are the compile's figures).
_WHAT_IS_COMPILED = ("model", "model_config", "strategy", "strategy_knobs", "target", "platform", "num_devices",
                     "topology", "seq_len", "batch_per_device", "loss_chunks", "step", "optimizer", "param_dtype",
                     "grad_accum", "capacity_bytes")


def judge_saved(base: Result, where: Path | str, current: Result, current_where: str, tolerance: Tolerance,
                max_peak: int | None, allow_version_drift: bool = False) -> Checked:
    """The gate without compiling: each baseline row judged against the row of ``current``
    (a saved result) of the same configuration and strategy, as if ``current`` were the
    recompile. A baseline row ``current`` lacks fails ("not in ..."); rows only ``current``
    has are not judged (``Checked.unjudged``). The two must share compiler versions, row by
    row, unless ``allow_version_drift``: this machine's versions do not matter, nothing is
    compiled here."""
    now = {(config_key(m), m.strategy): m for m in current.measurements}
    verdicts = []
    for group in base.comparisons:  # the order a recheck judges in
        for b in group:
            n = now.pop((config_key(b), b.strategy), None)
            if n is None:  # what was to be compiled, and none of the baseline's figures
                n = Measurement(**{f: getattr(b, f) for f in _WHAT_IS_COMPILED}, status="failed",
                                error=f"not in {current_where}")
            elif n.answered and not allow_version_drift:
                for pkg in _gated_packages(b):
                    if n.versions.get(pkg) != b.versions.get(pkg):
                        raise BadInput(f"{current_where}: {n.strategy} ({configuration(n)}) was compiled with {pkg} "
                                       f"{n.versions.get(pkg)}, the baseline's with {pkg} {b.versions.get(pkg)}; "
                                       "pass --allow-version-drift to judge it anyway")
            verdicts.append(judge(b, n, tolerance, max_peak))
    checked = Checked(verdicts, tolerance, max_peak, where, current=current_where)
    checked.unjudged = list(now.values())
    return checked


def check_saved(baseline: Path | str, current: str | Path | Sequence[str | Path] | Result, tolerance: Tolerance,
                max_peak: int | None, allow_version_drift: bool = False) -> Checked:
    """`check --current`: the baseline file read, ``current`` (result files merged as one, or
    a ``Result``) read, and judged by ``judge_saved``. The baseline's versions are compared
    with the current result's, not with this machine's."""
    base = load_baseline(Path(baseline), allow_version_drift=True)
    where, now = ("current", current) if isinstance(current, Result) else load_current(current)
    return judge_saved(base, baseline, now, where, tolerance, max_peak, allow_version_drift)


class Checked(list):
    """The gate's answer: one ``Verdict`` per strategy (a plain list of them, as it always
    was), with the tolerance, budget and baseline they were judged by, so that it prints
    (``memprobe.report``) and saves (``save``) as `memprobe check` prints and writes it."""

    def __init__(self, verdicts: list[Verdict], tolerance: Tolerance, max_peak: int | None,
                 baseline: Path | str, current: str | None = None) -> None:
        super().__init__(verdicts)
        self.tolerance, self.max_peak, self.baseline = tolerance, max_peak, baseline
        #: The saved result judged instead of a recompile (``check --current``), else None.
        self.current = current
        #: Rows of ``current`` that the baseline lacks, so were not judged.
        self.unjudged: list[Measurement] = []

    @property
    def passed(self) -> bool:
        """Whether the gate passes: `memprobe check`'s exit 0."""
        return all(v.passed for v in self)

    def to_json(self, command: str | None = None) -> dict:
        """What `memprobe check --format json` writes (schema ``memprobe.check``)."""
        return verdicts_json(self, self.tolerance, self.max_peak, self.baseline, command, self.current)

    def save(self, path: str | Path) -> None:
        """Writes ``to_json()`` to ``path``: `memprobe report` prints it again."""
        from memprobe.result import save_json

        save_json(path, self.to_json(), "checked", ("table", "markdown"), chart=False)


def summary(verdicts: list[Verdict], tolerance: Tolerance, max_peak: int | None, current: str | None = None) -> str:
    failed = [v for v in verdicts if not v.passed]
    several = len({configuration(v.base) for v in verdicts}) > 1
    return (f"memprobe check{f' of {current}' if current else ''}: {len(verdicts) - len(failed)} of "
            f"{len(verdicts)} within tolerance {tolerance}"
            + (f" and under {in_gib(max_peak)[0]}" if max_peak is not None else "")
            + ("" if not failed else "; failing: " + ", ".join(failing(v, several) for v in failed)))


def failing(v: Verdict, several: bool) -> str:
    """A failing verdict for the summary line: the strategy and its status, and its
    configuration where the baseline has several (a sweep's shapes)."""
    return f"{v.base.strategy} ({v.status}{', ' + configuration(v.base) if several else ''})"


CHECK_SCHEMA = "memprobe.check"


def verdicts_json(verdicts: list[Verdict], tolerance: Tolerance, max_peak: int | None,
                  baseline: Path | str, command: str | None = None, current: str | None = None) -> dict:
    """The gate's answer for a script or an archive (`memprobe check --format json`): one
    entry per strategy with exact bytes, the status the table shows, and the exit it means."""
    def entry(v: Verdict) -> dict:
        b, n = v.base, v.now
        return {"model": b.model, "strategy": b.strategy, "target": b.target, "topology": b.topology,
                "num_devices": b.num_devices, "seq_len": b.seq_len, "batch_per_device": b.batch_per_device,
                "step": b.step, "optimizer": b.optimizer, "param_dtype": b.param_dtype,
                "grad_accum": b.grad_accum,
                "status": v.status, "passed": v.passed,
                "baseline_peak_bytes": b.peak_bytes, "now_peak_bytes": n.peak_bytes if n.answered else None,
                "delta_bytes": n.peak_bytes - b.peak_bytes if n.answered else None,
                "allowed_growth_bytes": tolerance.allowed(b.peak_bytes),
                "baseline_host_bytes": b.host_bytes, "now_host_bytes": n.host_bytes if n.ok else None,
                "error": n.error}

    return {"schema": CHECK_SCHEMA, "schema_version": 1, "baseline": str(baseline), "current": current,
            "command": command, "tolerance": str(tolerance), "max_peak_bytes": max_peak,
            "passed": all(v.passed for v in verdicts), "summary": summary(verdicts, tolerance, max_peak, current),
            "verdicts": [entry(v) for v in verdicts]}


#: A saved verdict's fields and the types each may hold (None where the compile gave no figure).
_VERDICT_FIELDS = {
    **dict.fromkeys(("model", "strategy", "target", "step", "param_dtype", "status"), (str,)),
    "optimizer": (str, type(None)), "topology": (str, type(None)), "error": (str, type(None)), "passed": (bool,),
    **dict.fromkeys(("num_devices", "seq_len", "batch_per_device", "grad_accum", "baseline_peak_bytes",
                     "allowed_growth_bytes", "baseline_host_bytes"), (int,)),
    **dict.fromkeys(("now_peak_bytes", "delta_bytes", "now_host_bytes"), (int, type(None))),
}
STATUSES = ("ok", "improved", "regressed", "over budget", "host regressed", "refused", "failed")
#: How a refusal names each JSON type a field may hold.
_TYPE_WORDS = {str: "a string", int: "an integer", bool: "true or false", type(None): "null"}


def verdicts_from_json(data: object, where: str = "verdicts") -> dict:
    """Check's saved verdicts (what ``verdicts_json`` wrote), to render again; anything
    malformed is refused in one line naming the field."""
    from memprobe.result import saved_list

    for i, e in enumerate(saved_list(data, where, CHECK_SCHEMA, "check verdicts", "verdicts")):
        at = f"{where}: verdicts[{i}]"
        if not isinstance(e, dict):
            raise BadInput(f"{at}: expected an object")
        for field, kinds in _VERDICT_FIELDS.items():
            if field not in e:
                raise BadInput(f"{at}: missing field {field!r}")
            value = e[field]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                want = " or ".join(_TYPE_WORDS[k] for k in kinds)
                raise BadInput(f"{at}: {field}: expected {want}, got {value!r}")
        if e["status"] not in STATUSES:
            raise BadInput(f"{at}: status: {e['status']!r} is not one of {', '.join(STATUSES)}")
    for field, kind in (("summary", str), ("passed", bool)):
        if not isinstance(data.get(field), kind):
            raise BadInput(f"{where}: {field}: missing or not {_TYPE_WORDS[kind]}")
    return data


def _gated_packages(m: Measurement) -> tuple[str, ...]:
    """The packages whose versions a row's figures are compared across: jax, jaxlib and the
    row's compiler (libtpu on TPU, the CUDA plugin on GPU)."""
    return ("jax", "jaxlib", *({"tpu": ("libtpu",), "cuda": GPU_PACKAGES}.get(m.platform, ())))


def check_versions(base: Result, where: Path) -> None:
    for m in base.measurements:
        mine = versions(m.platform)
        for pkg in _gated_packages(m):
            theirs = m.versions.get(pkg)
            if theirs != mine.get(pkg):
                raise BadInput(f"{where}: baseline was compiled with {pkg} {theirs}, this is {pkg} "
                               f"{mine.get(pkg)}; write a new baseline or pass --allow-version-drift")
