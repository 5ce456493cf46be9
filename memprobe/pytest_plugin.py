"""memprobe's pytest plugin (registered through the ``pytest11`` entry point).

Gate a project's test suite on compiled peak memory, the way pytest-memray's
``limit_memory`` gates on allocations::

    @pytest.mark.memprobe_limit("90GiB", model="gemma4-e2b", strategy="scan-checkpoint",
                                target="tpu7x", seq=8192, batch=1)
    def test_e2b_fits():
        ...

The test's body runs first; then the configuration is compiled (in its own process, the
results cache answering repeats) and the test fails when the per-device peak exceeds the
limit, or when the compile fails. The ``memprobe_measure`` fixture gives the measurement
itself for assertions of your own.
"""

from __future__ import annotations

import pytest

from memprobe.errors import MemprobeError
from memprobe.measure import GIB, Measurement, parse_positive_size


def measure(*, model: str, seq: int, batch: int, strategy: str = "scan-checkpoint", target: str | None = None,
            devices: int | None = None, topology: str | None = None, step: str = "train",
            optimizer: str | None = None, param_dtype: str = "fp32", grad_accum: int = 1,
            loss_chunks: int | None = None, strategy_file: str | None = None,
            timeout: float = 3600.0) -> Measurement:
    """Compiles one configuration (or answers from the results cache) and returns its record;
    ``target`` defaults to tpu7x, or to the TPU kind a ``topology`` like v5p:2x2x1 names."""
    # Imported here, not at plugin load: a project's pytest start-up should not import JAX.
    from memprobe.cache import ResultCache
    from memprobe.compile import check_run, compile_jobs
    from memprobe.plan import make_plan
    from memprobe.strategy import load_catalogue, select
    from memprobe.targets import resolve_target, target_or_default

    check_run(None, timeout)
    catalogue = load_catalogue([strategy_file] if strategy_file else ())
    plan = make_plan(model=model, strategies=select(catalogue, [strategy]),
                     target=resolve_target(target_or_default(target, topology), devices, topology), seq_len=seq,
                     batch_per_device=batch,
                     loss_chunks=loss_chunks, step=step, optimizer=optimizer, param_dtype=param_dtype,
                     grad_accum=grad_accum)
    [m] = compile_jobs(plan.jobs(), timeout_s=timeout, cache=ResultCache())
    return m


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "memprobe_limit(limit, **config): fail the test when memprobe's compiled per-device peak "
        "for config (model, seq, batch, strategy, target, devices, ...) exceeds limit, e.g. '90GiB'.")


@pytest.fixture
def memprobe_measure():
    """``memprobe_measure(model=..., seq=..., batch=..., strategy=..., target=...)`` -> Measurement."""
    return measure


def _limit(limit: object) -> int:
    """The marker's limit in bytes: a size ("90GiB"), or an int, which counts bytes as in
    Python it does (90 * 2**30); "0GiB" or 0 would fail every peak and is refused."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit <= 0:
            raise ValueError(f"the limit must be a positive size, got {limit!r}")
        return limit
    return parse_positive_size(str(limit), "the limit")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    marker = item.get_closest_marker("memprobe_limit")
    if marker is None:
        return result
    if len(marker.args) != 1:
        pytest.fail("memprobe_limit takes one positional argument, the limit (e.g. '90GiB')", pytrace=False)
    try:
        limit = _limit(marker.args[0])
        m = measure(**marker.kwargs)
    except (MemprobeError, TypeError, ValueError) as e:
        reason = f"memprobe_limit: {e}"
    else:
        reason = None
    if reason is not None:  # outside the except: no "during handling of the above exception" chain
        pytest.fail(reason, pytrace=False)
    if m.refused:
        pytest.fail(f"memprobe: {m.model} {m.strategy} on {m.topology or m.target}: {m.error} (the limit is "
                    f"{marker.args[0]})", pytrace=False)
    if not m.ok:
        pytest.fail(f"memprobe: {m.strategy} failed to compile: {m.error}", pytrace=False)
    if m.peak_bytes > limit:
        pytest.fail(f"memprobe: {m.model} {m.strategy} on {m.topology or m.target}: per-device peak "
                    f"{m.peak_bytes / GIB:.3f} GiB ({m.peak_bytes:,} bytes) exceeds the limit "
                    f"{marker.args[0]} ({limit:,} bytes) by {(m.peak_bytes - limit):,} bytes "
                    "(compiler estimate)", pytrace=False)
    return result
