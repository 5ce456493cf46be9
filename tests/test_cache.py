"""The results cache: a hit gives back the same figures; a damaged entry is compiled again."""

import dataclasses
import json
import subprocess
import sys

from conftest import jobs_for
from memprobe.cache import TIMES_COMPACT_BYTES, ResultCache, _work
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


def test_compile_times_say_what_the_same_work_took_here(tmp_path):
    # One real compile is recorded; the same work at other shapes is answered from the
    # nearest shapes in tokens, the same shapes win once known, other work knows nothing, and a
    # damaged line (a traceback when it was no UTF-8) or a re-stored cache hit changes nothing.
    target = resolve_target("cpu", 1)
    jobs = jobs_for("tiny-e2b", target, seq=256, batch=1, strategies=["checkpoint", "unrolled"])
    job = jobs["checkpoint"]
    cache = ResultCache(tmp_path)
    env = compile_environment(job.target)
    m, _ = _run(job, cache)
    recorded = round(m.process_seconds, 1)
    assert cache.last_time(job) == (recorded, 256, 1)
    assert cache.last_time(jobs["unrolled"]) is None

    at_512 = jobs_for("tiny-e2b", target, seq=512, batch=1, strategies=["checkpoint"])["checkpoint"]
    at_2048 = jobs_for("tiny-e2b", target, seq=2048, batch=1, strategies=["checkpoint"])["checkpoint"]
    assert cache.last_time(at_512) == (recorded, 256, 1)
    with open(tmp_path / "compile-times.jsonl", "ab") as f:  # cut short, and bytes that are no UTF-8
        f.write(b'{"work": "cut sho\n\xff\xfe\n')
    cache.put(at_2048, env, dataclasses.replace(m, process_seconds=99.0))
    assert cache.last_time(at_2048) == (99.0, 2048, 1)
    assert cache.last_time(at_512) == (recorded, 256, 1)  # 2x the tokens is nearer than 4x
    cache.put(at_512, env, dataclasses.replace(m, process_seconds=5.0, cached=True))  # a hit traced again
    assert cache.last_time(at_512) == (recorded, 256, 1)

    # Past TIMES_COMPACT_BYTES the log keeps only the latest line of each work at each shape,
    # and answers as before.
    log = tmp_path / "compile-times.jsonl"
    stale = json.dumps({"work": _work(at_2048), "seq": 2048, "batch": 1, "seconds": 1.0, "when": 1})
    with open(log, "a") as f:
        f.write((stale + "\n") * (TIMES_COMPACT_BYTES // len(stale) + 1))
    cache.put(at_512, env, dataclasses.replace(m, process_seconds=7.0))
    assert len(log.read_text().splitlines()) == 3  # at 256, 2048 and 512: stale and damaged lines gone
    assert log.stat().st_size < 1000
    assert cache.last_time(job) == (recorded, 256, 1)
    assert cache.last_time(at_2048) == (99.0, 2048, 1)
    assert cache.last_time(at_512) == (7.0, 512, 1)
