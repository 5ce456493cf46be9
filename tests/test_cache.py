"""The results cache: a hit gives back the same figures; a damaged entry is compiled again."""

import dataclasses
import json
import subprocess
import sys

from conftest import jobs_for
from memprobe.cache import ResultCache
from memprobe.compile import compile_environment, compile_jobs
from memprobe.targets import resolve_target


def _run(job, cache):
    events = []
    [m] = compile_jobs([job], cache=cache, on_event=lambda i, state, e: events.append(state))
    return m, events


def test_cache_hit_is_identical_and_damage_is_recompiled(tmp_path):
    jobs = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=["checkpoint", "unrolled"])
    job = jobs["checkpoint"]
    cache = ResultCache(tmp_path)
    env = compile_environment(job.target)

    cold, events = _run(job, cache)
    assert cold.ok and not cold.cached and "compiling" in events
    [entry] = list(tmp_path.glob("*.json"))
    # Another strategy (other knobs) has no entry.
    assert cache.get(jobs["unrolled"], env) is None

    warm, events = _run(job, cache)
    assert warm.cached and events == ["cached"]
    assert dataclasses.replace(warm, cached=False).to_dict() == cold.to_dict()

    # An edited figure fails the entry's checksum: treated as missing.
    data = json.loads(entry.read_text())
    data["measurement"]["temp_bytes"] += 1
    entry.write_text(json.dumps(data))
    assert cache.get(job, env) is None

    # A truncated entry (a write cut short) is compiled again and rewritten whole.
    entry.write_text(entry.read_text()[:100])
    again, events = _run(job, cache)
    assert not again.cached and "compiling" in events
    assert again.temp_bytes == cold.temp_bytes
    assert cache.get(job, env).temp_bytes == cold.temp_bytes



def test_entry_without_matmul_flops_is_traced_not_recompiled(tmp_path):
    # Entries written before memprobe counted matmul FLOPs: the figures stand, the FLOPs
    # are filled in by a trace (seconds) instead of a compile (half an hour at full size).
    job = jobs_for("tiny-e2b", resolve_target("cpu", 1), seq=256, batch=1, strategies=["checkpoint"])["checkpoint"]
    cache = ResultCache(tmp_path)
    env = compile_environment(job.target)
    cold, _ = _run(job, cache)
    assert cold.matmul_flops > 0
    cache.put(job, env, dataclasses.replace(cold, matmul_flops=None))
    assert cache.get(job, env).matmul_flops is None

    warm, events = _run(job, cache)
    assert events[0] == "tracing" and events[-1] == "cached" and set(events) == {"tracing", "cached"}
    assert warm.cached
    assert warm.matmul_flops == cold.matmul_flops and warm.temp_bytes == cold.temp_bytes
    assert cache.get(job, env).matmul_flops == cold.matmul_flops


def test_answering_from_the_cache_needs_no_jax():
    # A warm re-run plans, reads the cache and writes JSON: none of that may import JAX,
    # Flax, pandas or matplotlib (together about 2 s of start-up here).
    code = ("import sys, memprobe.cli, memprobe.cache, memprobe.render;"
            "print(sorted(m for m in ('jax', 'flax', 'pandas', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout
