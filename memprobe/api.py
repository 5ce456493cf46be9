"""memprobe as a library: the plan, compiles and result of `memprobe compare`, without the CLI.

Nothing here prints. Bad input raises ``BadInput`` (a ``MemprobeError``) with the same
one-line message the CLI shows; a strategy whose compile fails is a row with ``error`` set,
never an exception, so the other strategies' figures are kept.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from memprobe.cache import ResultCache
from memprobe.compile import (DEFAULT_TIMEOUT_S, check_devices, check_run, compile_environment, compile_jobs,
                              default_host_cap, default_parallel, explain_isolated, map_stoppable)
from memprobe.errors import BadInput, unknown
from memprobe.gate import CHECK_SCHEMA, Checked, Tolerance, check_saved, limits, load_baseline, recheck
from memprobe.liveness import EXPLAIN_SCHEMA, Explained, Explanation
from memprobe.measure import Measurement
from memprobe.plan import DEFAULT_MODEL, CompileJob, Optimizer, ParamDtype, Plan, Step, job_labels, make_plan, sweep
from memprobe.render import DEFAULT_TOP
from memprobe.result import SCHEMA, Result, read_json
from memprobe.search import (AXES, FIT_SCHEMA, FITS_SCHEMA, FitResult, RoundRunner, fit_sweep, fits_from_json,
                             merge_fits, search_axis)
from memprobe.strategy import DEFAULT_STRATEGIES, Strategy, load_catalogue, select
from memprobe.targets import require_backend, resolve_target, target_or_default

if TYPE_CHECKING:
    import pandas as pd

#: ``on_event(strategy, state, seconds)``: state is "cached", "tracing", "compiling" (with the
#: seconds so far, four times a second), then "done", "refused" (the TPU compiler refused the
#: program over HBM: the row's ``needed_bytes`` says what it needed) or "failed" (with the
#: compile's seconds; for ``explain``, the seconds of its compile process).
OnEvent = Callable[[str, str, float], None]


def resolve_plan(*, seq: int, batch: int, model: str = DEFAULT_MODEL, target: str | None = None,
                 devices: int | None = None, topology: str | None = None,
                 strategies: Sequence[str | Strategy] | str | None = None,
                 strategy_files: Iterable[Path] = (), strategies_dirs: Iterable[Path] = (),
                 loss_chunks: int | None = None, step: Step | str = Step.TRAIN,
                 optimizer: Optimizer | str | None = None,
                 param_dtype: ParamDtype | str = ParamDtype.FP32, grad_accum: int = 1) -> tuple[Plan, list[str]]:
    """The checked plan, and the offload strategies left out because the target has no host
    memory to offload to: only of the default set (the four families and ``strategy_files``)
    or of "all" (every built-in and ``strategy_files``, alone or in a list: ["all", "mine"]);
    a named offload strategy on such a target is refused. A name given twice is planned once.
    A TPU ``topology`` is put to libtpu, in a process of its own (about two seconds), so that
    one it rejects is refused here rather than by every compile."""
    strategy_files = list(strategy_files)
    catalogue = load_catalogue(strategy_files, strategies_dirs)
    yours = [p.stem for p in strategy_files]  # --strategy-file's strategies join the default and "all"
    if isinstance(strategies, str) and strategies != "all":
        raise BadInput(f"strategies: give a list of names (or 'all'), not the string {strategies!r}")
    if strategies is None:
        wanted: list[str | Strategy] = [*DEFAULT_STRATEGIES, *yours]
    else:
        wanted = ["all"] if strategies == "all" else list(strategies)
    # What the default or "all" brings in is planned where the target allows it; a name
    # given is the user's wish, refused (by make_plan) where the target cannot run it.
    given = set() if strategies is None else {s.name if isinstance(s, Strategy) else s for s in wanted} - {"all"}
    named: dict[str, Strategy] = {}
    for s in wanted:  # the first of each name: a second row would only repeat it
        if s == "all":  # every built-in, then your --strategy-file ones, here in the list
            for each in [*(b for b in catalogue.values() if b.source == "built-in"), *select(catalogue, yours)]:
                named.setdefault(each.name, each)
            continue
        s = s if isinstance(s, Strategy) else select(catalogue, [s])[0]
        named.setdefault(s.name, s)
    chosen = list(named.values())
    target = target_or_default(target, topology)
    where = resolve_target(target, devices, topology)
    require_backend(where)
    skipped = [s.name for s in chosen if s.offload and not where.has_host_memory and s.name not in given]
    chosen = [s for s in chosen if s.name not in skipped]
    plan = make_plan(model=model, strategies=chosen, target=where, seq_len=seq, batch_per_device=batch,
                     loss_chunks=loss_chunks, step=step, optimizer=optimizer, param_dtype=param_dtype,
                     grad_accum=grad_accum)
    if (topology is not None or ":" in target) and where.platform == "tpu":  # --devices shapes are libtpu's own
        check_devices(plan.jobs()[0])
    return plan, skipped


def resolve_plans(*, seq: Sequence[int], batch: Sequence[int], target: Sequence[str | None], devices: int | None = None,
                  topology: str | None = None, loss_chunks: int | None = None,
                  **options) -> tuple[list[Plan], list[tuple[Plan, list[str]]]]:
    """The checked plans of a comparison: one per shape of a sweep (every length of ``seq``
    with every batch of ``batch``, lengths outer) on each target of ``target`` (its names,
    each with ``devices`` when given; targets outer, in the order given). One ``topology``
    for several targets is refused (a TPU target names its own, v5p:2x2x1). Also each
    target's plan with the offload strategies it leaves out (see ``resolve_plan``). A target
    named twice (v5p-8 and v5p:2x2x1 are one) is planned once."""
    if not target:
        raise BadInput("--target: give at least one target")
    if len(target) > 1 and topology is not None:
        raise BadInput(f"--topology {topology} with several targets: name each TPU target's topology "
                       "in --target instead (--target v5p:2x2x1,h100)")
    plans: dict[Plan, list[str]] = {}
    for name in target:
        plan, skipped = resolve_plan(seq=seq[0], batch=batch[0], target=name, devices=devices, topology=topology,
                                     loss_chunks=loss_chunks, **options)
        plans.setdefault(plan, skipped)
    return [p for plan in plans for p in sweep(plan, seq, batch, loss_chunks)], list(plans.items())


def run(plan: Plan | Sequence[Plan], *, jobs: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
        cache: bool = True, max_host_bytes: int | None = None, on_event: OnEvent | None = None) -> Result:
    """Compiles (or answers from the results cache) every strategy of ``plan`` (or of each
    plan of a sweep, all in one pool), each in its own process, ``jobs`` at a time (default:
    as many as cores and host memory allow)."""
    check_run(jobs, timeout_s)
    plans = [plan] if isinstance(plan, Plan) else list(plan)
    return Result(compile_labelled([j for p in plans for j in p.jobs()], job_labels(plans), jobs=jobs,
                                   timeout_s=timeout_s, cache=cache, max_host_bytes=max_host_bytes,
                                   on_event=on_event))


def target_names(target: str | Sequence[str] | None) -> list[str | None]:
    """One target or several, as a list; None (the default, which ``resolve_plan`` picks from
    the topology) stays one."""
    return [target] if target is None or isinstance(target, str) else list(target)


def listed(value: int | Sequence[int], option: str) -> list[int]:
    """One value or several (a sweep), as a list; an empty list is refused."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise BadInput(f"{option}: give at least one value")
    return values


def compile_labelled(wanted: list[CompileJob], labels: list[str], *, jobs: int | None, timeout_s: float,
                     cache: bool, max_host_bytes: int | None, on_event: OnEvent | None) -> list[Measurement]:
    """``compile_jobs`` with the defaults filled in and its events named by ``labels``."""
    return compile_jobs(
        wanted, timeout_s=timeout_s, parallel=jobs or default_parallel(len(wanted)),
        on_event=(lambda i, state, seconds: on_event(labels[i], state, seconds)) if on_event else None,
        cache=ResultCache() if cache else None,
        max_host_bytes=default_host_cap() if max_host_bytes is None else max_host_bytes)


def compare(*, seq: int | Sequence[int] = 24576, batch: int | Sequence[int] = 8, model: str = DEFAULT_MODEL,
            target: str | Sequence[str] | None = None, devices: int | None = None,
            topology: str | None = None, strategies: Sequence[str | Strategy] | str | None = None,
            strategy_files: Iterable[Path] = (), strategies_dirs: Iterable[Path] = (),
            loss_chunks: int | None = None, step: Step | str = Step.TRAIN,
            optimizer: Optimizer | str | None = None, param_dtype: ParamDtype | str = ParamDtype.FP32,
            grad_accum: int = 1, jobs: int | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, cache: bool = True, max_host_bytes: int | None = None,
            on_event: OnEvent | None = None) -> Result:
    """`memprobe compare` as a call: the train step of ``model`` (a preset's name, or a model
    file's path, "my-model.toml") compiled for ``target`` (default tpu7x, or the TPU kind a
    ``topology`` like v5p:2x2x1 names) under each strategy (names,
    ``Strategy`` objects or "all"; default the four families, less the offload one where the
    target has no host memory), per-device peak figures in the result.

    ``max_host_bytes``: host memory one compile process may use before it is stopped and
    its row marked failed (default 90% of this machine's memory).

    ``seq`` and ``batch`` may each be a list: a sweep, every strategy at every pair (lengths
    outer), one comparison per pair in the result; progress then names the shapes
    ("checkpoint @ seq 8192"). ``target`` may be a list too: every strategy on each target
    (at each shape), one comparison per target and shape ("checkpoint @ h100 (8 devices)")."""
    plans, _ = resolve_plans(seq=listed(seq, "seq"), batch=listed(batch, "batch"),
                             target=target_names(target), devices=devices,
                             topology=topology, loss_chunks=loss_chunks, model=model, strategies=strategies,
                             strategy_files=strategy_files, strategies_dirs=strategies_dirs, step=step,
                             optimizer=optimizer, param_dtype=param_dtype, grad_accum=grad_accum)
    return run(plans, jobs=jobs, timeout_s=timeout_s, cache=cache, max_host_bytes=max_host_bytes,
               on_event=on_event)


def check(baseline: str | Path, *, tolerance: str | Tolerance = "2%", max_peak: str | int | None = None,
          allow_version_drift: bool = False, current: str | Path | Sequence[str | Path] | Result | None = None,
          jobs: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, cache: bool = True,
          max_host_bytes: int | None = None, on_event: OnEvent | None = None) -> Checked:
    """`memprobe check` as a call: every configuration of ``baseline`` compiled again, one
    ``Verdict`` per strategy in the list returned (``passed``; ``status`` "ok", "improved",
    "regressed", "over budget", "host regressed", "refused" (over HBM, by the TPU compiler) or
    "failed"). The list's own ``passed`` is the gate's answer; ``report()`` prints it as the
    command does, ``save()`` writes its JSON. ``tolerance`` like "2%" or "0.5GiB"; ``max_peak``
    a size like "90GiB", or an int of bytes. Every plan is checked before anything compiles.

    With ``current`` (a saved result's file, a list of them merged as one, or a ``Result``),
    nothing compiles: its rows are judged as the recompile would be (`memprobe check
    --current`); a baseline row it lacks fails, and its versions, not this machine's, must
    match the baseline's."""
    tol, budget = limits(tolerance, max_peak)
    if current is not None:
        return check_saved(baseline, current, tol, budget, allow_version_drift)
    base = load_baseline(Path(baseline), allow_version_drift)
    return recheck(base, Path(baseline), tol, budget,
                   lambda plans: run(plans, jobs=jobs, timeout_s=timeout_s, cache=cache,
                                     max_host_bytes=max_host_bytes, on_event=on_event).measurements)


def fit(*, vary: str = "batch", seq: int | Sequence[int] | None = None, batch: int | Sequence[int] | None = None,
        model: str = DEFAULT_MODEL,
        target: str | Sequence[str] | None = None, devices: int | None = None, topology: str | None = None,
        strategies: Sequence[str | Strategy] | str | None = None, strategy_files: Iterable[Path] = (),
        strategies_dirs: Iterable[Path] = (), loss_chunks: int | None = None, step: Step | str = Step.TRAIN,
        optimizer: Optimizer | str | None = None, param_dtype: ParamDtype | str = ParamDtype.FP32,
        grad_accum: int = 1,
        budget: str | int | None = None, max_batch: int | None = None, max_seq: int | None = None,
        host_ram: str | int | None = None, devices_per_host: int | None = None, jobs: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S, cache: bool = True, max_host_bytes: int | None = None,
        on_event: OnEvent | None = None, runner: RoundRunner | None = None,
        on_skipped: Callable[[Plan, list[str]], None] | None = None) -> FitResult | list[FitResult]:
    """`memprobe fit` as a call: the largest per-device batch at ``seq`` (``vary="batch"``), or
    the longest sequence at ``batch`` in whole attention blocks (``vary="seq"``), at which
    each strategy's step fits ``budget`` (a size like "85GiB", an int of bytes, or the target's HBM)
    and, with ``host_ram``, its host bytes fit one host's RAM. ``FitResult.answers()`` gives
    the size per strategy. Labels in ``on_event`` are "STRATEGY batch N" / "STRATEGY seq N".
    ``runner`` replaces how a round is compiled (the CLI passes its progress display);
    ``on_skipped(plan, names)`` is told the offload strategies the target leaves out (no host
    memory), once every option is checked, as the first round starts.

    The shape held fixed (``seq``, or ``batch`` with ``vary="seq"``) may be a list: a sweep,
    one ``FitResult`` per value in a list, labels naming the shape ("checkpoint batch 3 @ seq
    8192"). ``target`` may be a list too: the search on each target (at each shape; targets
    outer), each against its own HBM unless ``budget`` is given, one ``FitResult`` each in a
    list, labels naming the target ("checkpoint batch 3 @ h100 (8 devices)"); ``on_skipped``
    is then told each target's."""
    if vary not in AXES:
        raise BadInput(f"vary: {vary!r} is not one of {', '.join(AXES)}")
    asked = seq if vary == "batch" else batch  # the shape held fixed: one value, or a list (a sweep)
    seqs, batches = (None if v is None else listed(v, name) for v, name in ((seq, "seq"), (batch, "batch")))
    axis, unit, max_n, seq0, batch0 = search_axis(vary, seqs and seqs[0], batches and batches[0], max_batch,
                                                  max_seq, loss_chunks)
    plans, skipped = resolve_plans(seq=[seq0], batch=[batch0], target=target_names(target),
                                   devices=devices, topology=topology, loss_chunks=loss_chunks,
                                   model=model, strategies=strategies, strategy_files=strategy_files,
                                   strategies_dirs=strategies_dirs, step=step, optimizer=optimizer,
                                   param_dtype=param_dtype, grad_accum=grad_accum)
    check_run(jobs, timeout_s)
    rounds = 0

    def each_round(wanted: list[CompileJob], labels: list[str], what: str) -> list[Measurement]:
        nonlocal rounds
        rounds += 1
        if rounds == 1 and on_skipped is not None:  # fit_sweep checks every budget and host_ram first
            for plan, names in skipped:
                on_skipped(plan, names)
        if runner is not None:
            return runner(wanted, labels, what)
        return compile_labelled(wanted, labels, jobs=jobs, timeout_s=timeout_s, cache=cache,
                                max_host_bytes=max_host_bytes, on_event=on_event)

    fixed = (seqs or [seq0]) if axis == "batch" else (batches or [batch0])
    found = fit_sweep(plans, axis, unit, max_n, each_round, fixed, loss_chunks, budget=budget, host_ram=host_ram,
                      devices_per_host=devices_per_host)
    one_target = target is None or isinstance(target, str)
    return found if isinstance(asked, (list, tuple)) or not one_target else found[0]


def explain(strategy: str | Strategy | None = None, *, diff: Sequence[str | Strategy] | None = None,
            seq: int = 24576, batch: int = 8, model: str = DEFAULT_MODEL, target: str | None = None,
            devices: int | None = None, topology: str | None = None, strategy_files: Iterable[Path] = (),
            strategies_dirs: Iterable[Path] = (), loss_chunks: int | None = None, step: Step | str = Step.TRAIN,
            optimizer: Optimizer | str | None = None, param_dtype: ParamDtype | str = ParamDtype.FP32,
            grad_accum: int = 1,
            timeout_s: float = DEFAULT_TIMEOUT_S, cache: bool = True, max_host_bytes: int | None = None,
            on_event: OnEvent | None = None) -> Explained:
    """`memprobe explain` as a call: one ``strategy`` (or the two of ``diff``) compiled with the
    compiler's dump files on, and the buffers live at each one's peak. ``Explained.diff``
    groups what separates the two; ``report(explained, fmt)`` renders it like the CLI. A
    failed compile leaves its explanation None (``Explained.failed``), never an exception,
    and the other strategy's answer is kept; so does a program the TPU compiler refuses over
    HBM, whose measurement lists its out-of-memory report (``oom_allocations``). Both of a
    diff compile at once where host memory allows two compiles; answers are kept in the
    results cache."""
    plan = explain_plan(strategy, diff, seq=seq, batch=batch, model=model, target=target, devices=devices,
                        topology=topology, strategy_files=strategy_files, strategies_dirs=strategies_dirs,
                        loss_chunks=loss_chunks, step=step, optimizer=optimizer, param_dtype=param_dtype,
                        grad_accum=grad_accum)
    return run_explain(plan, timeout_s=timeout_s, cache=cache, max_host_bytes=max_host_bytes, on_event=on_event)


def explain_plan(strategy: str | Strategy | None, diff: Sequence[str | Strategy] | None, **plan) -> Plan:
    """The checked plan of an ``explain``: one strategy, or two different ones to diff;
    ``plan`` takes ``resolve_plan``'s keywords but ``strategies``."""
    if (strategy is None) == (diff is None):
        raise BadInput("give exactly one of --strategy NAME or --diff A B")
    if diff is not None and (isinstance(diff, (str, Strategy)) or len(diff) != 2):
        raise BadInput("--diff needs two strategies, A B")
    wanted = [strategy] if diff is None else list(diff)
    names = [s.name if isinstance(s, Strategy) else s for s in wanted]
    if len(set(names)) != len(names):
        raise BadInput(f"--diff needs two different strategies, got {names[0]} twice")
    return resolve_plan(strategies=wanted, **plan)[0]


def run_explain(plan: Plan, *, timeout_s: float = DEFAULT_TIMEOUT_S, cache: bool = True,
                max_host_bytes: int | None = None, on_event: OnEvent | None = None) -> Explained:
    """Compiles (or answers from the results cache) ``plan``'s strategies with dumps on, at
    once where host memory allows, and reads what is live at each peak."""
    check_run(None, timeout_s)
    cap = default_host_cap() if max_host_bytes is None else max_host_bytes
    store = ResultCache() if cache else None
    jobs = plan.jobs()
    return Explained(map_stoppable(lambda job, stop: _explain_one(job, timeout_s, cap, store, on_event, stop),
                                   jobs, default_parallel(len(jobs))))


def _explain_one(job: CompileJob, timeout_s: float, cap: int | None, store: ResultCache | None,
                 on_event: OnEvent | None, stop) -> tuple[Measurement, Explanation | None]:
    name, env = job.strategy.name, compile_environment(job.target)
    hit = store.get_explained(job, env) if store else None
    if hit:
        if on_event:
            on_event(name, "cached", 0.0)
        return hit[0], Explanation.from_dict(hit[1])
    refused = store.get(job, env) if store else None
    # `compare` already heard the compiler refuse it (and kept its report: a refusal cached
    # before memprobe kept one compiles again, to list it)
    if refused is not None and refused.refused and refused.oom_allocations is not None:
        if on_event:
            on_event(name, "cached", 0.0)
        return refused, None
    if on_event:
        on_event(name, "compiling", 0.0)
    tick = (lambda seconds: on_event(name, "compiling", seconds)) if on_event else None
    started = time.monotonic()
    m, explanation = explain_isolated(job, timeout_s, tick, cap, stop)
    if not m.ok or explanation is None:
        if store and m.refused:
            store.put(job, env, m)
        if on_event:
            on_event(name, "refused" if m.refused else "failed", time.monotonic() - started)
        return m, None
    if store:
        store.put_explained(job, env, m, explanation)
    if on_event:
        on_event(name, "done", time.monotonic() - started)
    return m, Explanation.from_dict(explanation)


def load(path: str | Path) -> Result | FitResult | list[FitResult] | Explained:
    """What the library or the command line saved, read back for ``report``: a result
    (``Result.save``, `--format json`, `memprobe baseline`); a fit (``FitResult.save``, `memprobe
    fit --format json`), or the list of a sweep's fits; or an ``explain`` answer
    (``Explained.save``, `memprobe explain --format json`)."""
    data = read_json(Path(path))
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == EXPLAIN_SCHEMA:
        from memprobe.render.explain import from_json  # pandas, only for an explain answer

        return from_json(data, str(path))
    if schema in (FIT_SCHEMA, FITS_SCHEMA):
        fits = fits_from_json(data, str(path))
        return fits if schema == FITS_SCHEMA else fits[0]
    if schema == CHECK_SCHEMA:  # a verdict keeps the peaks it judged, not the figures to build a Result
        raise BadInput(f"{path}: check's verdicts, which memprobe.load does not read back; `memprobe report "
                       f"{path}` prints them")
    if isinstance(data, dict) and schema != SCHEMA:
        found = f"schema {schema!r}" if "schema" in data else 'no "schema" field'
        raise BadInput(f"{path}: memprobe.load cannot read this ({found}; it reads {SCHEMA!r}, {FIT_SCHEMA!r}, "
                       f"{FITS_SCHEMA!r} and {EXPLAIN_SCHEMA!r})")
    return Result.from_json(data, str(path))


def frame(result: Result) -> pd.DataFrame:
    """One row per strategy and configuration, ranked by peak within each configuration:
    GiB as floats, exact bytes as integers (the columns of `--format csv`)."""
    from memprobe.render.csv import frame as csv_frame

    return csv_frame(result)


def report(result: Result | FitResult | Sequence[FitResult] | Explained | Checked, fmt: str = "table",
           file: IO[str] | None = None, *, top: int = DEFAULT_TOP) -> str | None:
    """`memprobe report` as a call: ``result`` as table, markdown, json, csv or html, written
    to ``file``, or returned as a string when no file is given. A fit (or the list of a
    sweep's fits) renders as `memprobe fit` prints it: table, markdown or json. An ``explain``
    answer renders as `memprobe explain` prints it (table, markdown or json), ``top`` buffers
    or diff groups listed and the rest summed. ``check``'s verdicts render as `memprobe check`
    prints them (table, markdown or json)."""
    from memprobe.render import CheckFormat, ExplainFormat, FitFormat, Format, check_top, render as render_to

    checked = isinstance(result, Checked)  # a list too, of verdicts
    fits = None if checked else [result] if isinstance(result, FitResult) else \
        list(result) if isinstance(result, (list, tuple)) else None
    if fits is not None and (not fits or not all(isinstance(f, FitResult) for f in fits)):
        raise BadInput("report: a list renders as the fits of one sweep; give FitResults (one result otherwise)")
    if fits is not None:  # fits of one sweep, as `memprobe report` merges files; the order as given
        merge_fits([(f"fits[{i}]", [f]) for i, f in enumerate(fits)])
    formats = (CheckFormat if checked else ExplainFormat if isinstance(result, Explained)
               else FitFormat if fits is not None else Format)
    known = tuple(f.value for f in formats)
    if fmt not in known:
        raise unknown("format", fmt, known)
    out = file if file is not None else io.StringIO()
    if checked:
        from memprobe.render.check import write as write_verdicts  # pandas, only for verdicts

        write_verdicts(result.to_json(), fmt, out)
    elif isinstance(result, Explained):
        from memprobe.render.explain import write  # pandas, only for an explain answer

        check_top(top)
        write(result, fmt, out, top)
    elif fits is not None:
        from memprobe.render.fit import render_fits  # pandas, through the shared footnotes

        render_fits(fits, FitFormat(fmt), out)
    else:
        render_to(result, Format(fmt), out)
    return None if file is not None else out.getvalue()
