"""Test set-up: JAX is configured once, before it initialises, as a compile process is.

Most tests compile in this process (``compile_job``) for speed; the CLI tests go through
the isolated per-strategy processes, as users do.
"""

import os

from memprobe.compile import compile_environment
from memprobe.targets import resolve_target

# Four CPU devices, so CPU tests can shard; TPU tests use libtpu's compile-only devices.
os.environ.update(compile_environment(resolve_target("cpu", 4)))
