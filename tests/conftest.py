"""Test set-up: JAX is configured once, before it initialises, as a compile process is.

Most tests compile in this process (``compile_job``) for speed; the CLI tests go through
the isolated per-strategy processes, as users do.
"""

import atexit
import os
import shutil
import tempfile

from memprobe.compile import compile_environment
from memprobe.plan import Step, make_plan
from memprobe.strategy import DEFAULT_STRATEGIES, load_catalogue, select
from memprobe.targets import resolve_target

# Four CPU devices, so CPU tests can shard; TPU tests use libtpu's compile-only devices.
os.environ.update(compile_environment(resolve_target("cpu", 4)))
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment (measured:
# a plain pytest process has neither). memprobe lays piped tables out to $COLUMNS, so the
# commands the tests run would print 80-column tables as if a user had asked for them; a
# test that wants a width passes COLUMNS itself.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# A results cache of this test process's own, so no answer comes from an earlier run.
os.environ["MEMPROBE_CACHE_DIR"] = tempfile.mkdtemp(prefix="memprobe-test-cache-")
atexit.register(shutil.rmtree, os.environ["MEMPROBE_CACHE_DIR"], ignore_errors=True)


def jobs_for(model, target, seq, batch, strategies=DEFAULT_STRATEGIES, step=Step.TRAIN):
    """The compile jobs of a comparison, by strategy name."""
    plan = make_plan(model=model, strategies=select(load_catalogue(), strategies), target=target,
                     seq_len=seq, batch_per_device=batch, step=step)
    return plan.jobs_by_strategy()
