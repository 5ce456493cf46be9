"""`memprobe check`: the CI regression gate.

Recompiles every configuration in a baseline result and compares each strategy's peak,
and its host bytes (offload), with the baseline's: exit 0 when every peak and every host
figure is within tolerance of the baseline and the peaks are under the budget, 1 when
any regresses, exceeds the budget or fails to compile, 2 for bad input (a missing or
malformed baseline, compiler versions that differ from the baseline's).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from memprobe.cli import _options as o
from memprobe.cli.compare import check_run_options, run_plan
from memprobe.compile import DEFAULT_TIMEOUT_S, GPU_PACKAGES, versions
from memprobe.errors import BadInput
from memprobe.measure import GIB, Measurement, parse_size
from memprobe.plan import Step, make_plan
from memprobe.render import terminal_width
from memprobe.result import Result
from memprobe.strategy import strategy_from_mapping
from memprobe.targets import require_backend, resolve_target

if TYPE_CHECKING:
    import pandas as pd

# The versions a baseline must share with this run: they decide the compiled figures.
COMPILER_PACKAGES = ("jax", "jaxlib", "libtpu")


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
            if value < 0:
                raise BadInput(f"--tolerance: {text!r} is not a percentage like 2%")
            return cls(relative=value / 100)
        size = parse_size(t, "--tolerance")
        return cls(absolute_bytes=size)

    def allowed(self, base_bytes: int) -> int:
        if self.relative is not None:
            return int(base_bytes * self.relative)
        return self.absolute_bytes or 0

    def __str__(self) -> str:
        if self.relative is not None:
            return f"{self.relative * 100:g}%"
        return f"{(self.absolute_bytes or 0) / GIB:.2f} GiB"


@dataclasses.dataclass(frozen=True)
class Verdict:
    base: Measurement
    now: Measurement
    status: str  # "ok", "improved", "regressed", "over budget", "host regressed", "failed"

    @property
    def passed(self) -> bool:
        return self.status in ("ok", "improved")


def judge(base: Measurement, now: Measurement, tolerance: Tolerance, max_peak: int | None) -> Verdict:
    if not now.ok:
        return Verdict(base, now, "failed")
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


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    import pandas as pd

    host = any(v.base.host_bytes or (v.now.ok and v.now.host_bytes) for v in verdicts)
    rows = []
    for v in verdicts:
        b, n = v.base, v.now
        where = f"{b.model} seq {b.seq_len} x {b.batch_per_device} on {b.topology or b.target}"
        rows.append({
            "configuration": where,
            "strategy": b.strategy,
            "baseline GiB": f"{b.peak_bytes / GIB:.3f}",
            "now GiB": f"{n.peak_bytes / GIB:.3f}" if n.ok else "-",
            "delta GiB": f"{(n.peak_bytes - b.peak_bytes) / GIB:+.3f}" if n.ok else "-",
            "delta %": f"{100 * (n.peak_bytes - b.peak_bytes) / b.peak_bytes:+.2f}%" if n.ok and b.peak_bytes else "-",
            "now bytes": f"{n.peak_bytes:,}" if n.ok else "-",
            # exact bytes: offloaded figures are often far below a GiB
            **({"host baseline bytes": f"{b.host_bytes:,}",
                "host now bytes": f"{n.host_bytes:,}" if n.ok else "-"} if host else {}),
            "status": v.status if n.ok else f"failed: {n.error}",
        })
    return pd.DataFrame(rows)


def check(
    baseline: Annotated[Path, typer.Option("--baseline", help="A baseline written by `memprobe baseline`.")],
    tolerance: Annotated[str, typer.Option("--tolerance", help="Allowed growth of a peak, and of the "
                                           "host bytes: relative (2%) or absolute (0.5GiB).")] = "2%",
    max_peak: Annotated[str | None, typer.Option("--max-peak", help="A budget no peak may exceed, "
                                                 "e.g. 90GiB.")] = None,
    allow_version_drift: Annotated[bool, typer.Option(
        "--allow-version-drift", help="Compare even when jax/jaxlib/libtpu differ from the baseline's.")] = False,
    timeout: o.Timeout = DEFAULT_TIMEOUT_S,
    jobs: o.Jobs = None,
    no_cache: o.NoCache = False,
    max_host_memory: o.MaxHostMemory = None,
) -> int:
    """Recompile a baseline's configurations and fail when a peak (or an offload strategy's host
    bytes) regressed, or a peak exceeds a budget.

    Exit 0: every peak and host figure within tolerance, every peak under --max-peak. Exit 1:
    a regression, a peak over budget or a failed compile. Exit 2: bad input. With $GITHUB_STEP_SUMMARY set, the
    table is also appended there as markdown.
    """
    tol = Tolerance.parse(tolerance)
    budget = parse_size(max_peak, "--max-peak") if max_peak is not None else None
    cap = check_run_options(timeout, jobs, max_host_memory)
    base = Result.load(baseline)
    if not all(m.ok for m in base.measurements):
        raise BadInput(f"{baseline}: the baseline has failed rows; write it again with `memprobe baseline`")
    if not allow_version_drift:
        _check_versions(base, baseline)
    verdicts: list[Verdict] = []
    for group in base.comparisons:
        m0 = group[0]
        strategies = [strategy_from_mapping(m.strategy, {"description": "from the baseline", **m.strategy_knobs},
                                            f"{baseline}: {m.strategy}") for m in group]
        try:
            step = Step(m0.step)
        except ValueError:
            raise BadInput(f"{baseline}: step {m0.step!r} is not one of train, grad") from None
        target = resolve_target(m0.target, m0.num_devices, m0.topology if m0.platform != "cpu" else None)
        require_backend(target)
        plan = make_plan(model=m0.model, strategies=strategies, target=target, seq_len=m0.seq_len,
                         batch_per_device=m0.batch_per_device, loss_chunks=m0.loss_chunks, step=step)
        now = run_plan(plan, timeout, jobs, no_cache, cap)
        verdicts += [judge(b, n, tol, budget) for b, n in zip(group, now)]
    frame = verdict_frame(verdicts)
    failed = [v for v in verdicts if not v.passed]
    summary = (f"memprobe check: {len(verdicts) - len(failed)} of {len(verdicts)} within tolerance {tol}"
               + (f" and under {budget / GIB:.2f} GiB" if budget is not None else "")
               + ("" if not failed else "; failing: " + ", ".join(f"{v.base.strategy} ({v.status})" for v in failed)))
    _print(frame, summary)
    _write_step_summary(frame, summary)
    return 1 if failed else 0


def _check_versions(base: Result, where: Path) -> None:
    for m in base.measurements:
        mine = versions(m.platform)
        for pkg in (*COMPILER_PACKAGES, *(GPU_PACKAGES if m.platform == "cuda" else ())):
            if pkg == "libtpu" and m.platform != "tpu":
                continue
            theirs = m.versions.get(pkg)
            if theirs != mine.get(pkg):
                raise BadInput(f"{where}: baseline was compiled with {pkg} {theirs}, this is {pkg} "
                               f"{mine.get(pkg)}; write a new baseline or pass --allow-version-drift")


def _print(frame: pd.DataFrame, summary: str) -> None:
    t = Table(title="memprobe check: per-device peak vs baseline (compiler estimate)")
    for col in frame.columns:
        t.add_column(col, justify="left" if col in ("configuration", "strategy", "status") else "right")
    for row in frame.itertuples(index=False):
        cells = [str(c) for c in row]
        status = cells[-1]
        cells[-1] = status if status in ("ok", "improved") else f"[bold red]{status}[/]"
        t.add_row(*cells)
    console = Console(width=terminal_width(sys.stdout))
    console.print(t)
    console.print(summary, markup=False, highlight=False)


def _write_step_summary(frame: pd.DataFrame, summary: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write("### memprobe check\n\n" + frame.to_markdown(index=False, disable_numparse=True)
                    + f"\n\n{summary}\n\n")
    except OSError as e:
        raise BadInput(f"GITHUB_STEP_SUMMARY {path}: cannot write ({e.strerror})") from None
