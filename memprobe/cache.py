"""The results cache: a finished measurement, stored under a key of all that decides it.

A full-size compile takes half an hour here, so a repeated comparison answers from this
cache instead. The key is a hash of what determines the compiled program and its figures:

- the model configuration, the strategy's knobs, the target and topology, the shapes and
  the step;
- the versions of jax, jaxlib, libtpu, flax and optax, and the compiler flags
  (``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``) the compile process runs with;
- a fingerprint of memprobe's own sources that build the program (the model, the
  strategy wrapper, the train step) and ``FORMAT``, bumped when the way a record is read
  from the compiler changes; an ``explain`` answer's key also carries ``EXPLAIN_FORMAT``,
  bumped when the way the buffer listing is read changes.

The key is computed without tracing: hashing the lowered program would cost a full trace
and lowering (about a minute at full size) on every cache hit. Only answers are stored: a
measurement, or a program the TPU compiler refused over HBM (as deterministic as a peak);
a failure may be transient (a timeout, host memory).

Each entry is one JSON file written atomically (temporary file, then ``os.replace``) and
carries a checksum of its measurement; an entry that does not parse, has the wrong key or
fails its checksum is treated as missing, so that job compiles again.

We do not use JAX's persistent compilation cache: executables loaded from it can lose
their memory statistics, and the figures are all memprobe needs.

Beside the entries, ``compile-times.jsonl`` keeps one line per compile this machine ran
(what was compiled, the shapes, how long the compile process took), so that a long run can
say what to expect before it ends (``ResultCache.last_time``); past 512 KiB it is compacted
to the latest line of each work at each shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

from memprobe.measure import Measurement
from memprobe.model_file import is_preset
from memprobe.plan import CompileJob

FORMAT = 1
# What an explain record holds, by version: 10 libtpu's log of the HBM heap (its size and
# fragmentation) kept beside the dump's reading; 9 a scan's stacks named after what is stacked, a
# loop's outputs after what its body passes on; 8 values of called computations (call, async)
# named through their callers; 7 loop carries and the step's own scopes named; 6 the host
# buffers listed, the host allocations summed; 5 host memory (space 5) read too, its curve
# sampled; 4 the curve is (position, HBM bytes live); 3 HBM only, shared addresses once, the
# peak split (1: the live-range file's own peak).
EXPLAIN_FORMAT = 10
_PACKAGE = Path(__file__).resolve().parent
# The sources that build the program. The strategy enters the key by its knobs as
# compiled; how a record is read from the compiler is covered by FORMAT.
_PROGRAM_SOURCES = ("model", "remat.py", "build.py")
# The compile-times log is compacted once it passes this size (about 4,000 lines of ~125
# bytes), to at most TIMES_KEPT lines.
TIMES_COMPACT_BYTES = 512 * 1024
TIMES_KEPT = 1000


def default_dir() -> Path:
    if os.environ.get("MEMPROBE_CACHE_DIR"):
        return Path(os.environ["MEMPROBE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memprobe"


@cache
def source_fingerprint() -> str:
    h = hashlib.sha256()
    for name in _PROGRAM_SOURCES:
        p = _PACKAGE / name
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(f.relative_to(_PACKAGE).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _versions(platform: str) -> dict[str, str]:
    from memprobe.compile import GPU_PACKAGES, package_versions

    return package_versions(("jax", "jaxlib", "libtpu", "flax", "optax", *(GPU_PACKAGES if platform == "cuda" else ())))


def key_fields(job: CompileJob, env: dict[str, str]) -> dict[str, Any]:
    """Everything the key is made of, readable (it is stored in the entry too)."""
    return {
        "format": FORMAT,
        "sources": source_fingerprint(),
        "model": dataclasses.asdict(job.model),
        "strategy": job.strategy.as_compiled().knobs(),
        "target": dataclasses.asdict(job.target),
        "shapes": dataclasses.asdict(job.shapes),
        "step": job.step.value,
        **_training(job),
        "versions": _versions(job.target.platform),
        "flags": {k: env.get(k, "") for k in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")},
    }


def _work(job: CompileJob) -> str:
    """What a compile's duration depends on, apart from the shapes."""
    model = job.model.name if is_preset(job.model) else dataclasses.asdict(job.model)
    return _digest({"model": model, "strategy": job.strategy.as_compiled().knobs(),
                    "target": dataclasses.asdict(job.target), "step": job.step.value,
                    **_training(job)})


def _training(job: CompileJob) -> dict[str, str | int]:
    """The optimizer, parameter dtype and gradient accumulation where they are not the
    default (AdamW, fp32, none), so that results and compile-time records of default steps
    made before these knobs existed still match."""
    out: dict[str, str | int] = {}
    if job.optimizer is not None and job.optimizer.value != "adamw":  # None: a grad step
        out["optimizer"] = job.optimizer.value
    if job.param_dtype.value != "fp32":
        out["param_dtype"] = job.param_dtype.value
    if job.grad_accum != 1:
        out["grad_accum"] = job.grad_accum
    return out


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class ResultCache:
    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else default_dir()

    def _path(self, key: dict[str, Any]) -> Path:
        return self.directory / f"{_digest(key)}.json"

    def unwritable(self) -> str | None:
        """Why no answer could be kept here (the directory cannot be made, or a file written
        in it), or None: writes fail silently, so a run asks before it starts."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.directory, prefix=".probe-"):
                return None
        except OSError as e:
            return e.strerror or str(e)

    def get(self, job: CompileJob, env: dict[str, str]) -> Measurement | None:
        """The stored measurement for ``job``, renamed to its strategy; None when absent or bad."""
        hit = self._read(job, key_fields(job, env))
        return hit[0] if hit else None

    def get_explained(self, job: CompileJob, env: dict[str, str]) -> tuple[Measurement, dict] | None:
        """The stored ``memprobe explain`` answer for ``job``: (measurement, explanation)."""
        return self._read(job, {**key_fields(job, env), "explain": EXPLAIN_FORMAT}, explained=True)

    def _read(self, job: CompileJob, key: dict[str, Any], explained: bool = False):
        try:
            entry = json.loads(self._path(key).read_text())
            record = entry["measurement"]
            explanation = entry["explanation"] if explained else None
            signed = [record, explanation] if explained else record
            if entry["key"] != json.loads(json.dumps(key, default=str)) or entry["checksum"] != _digest(signed):
                return None
            m = Measurement.from_dict(record)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        # Two strategy files with the same knobs share an entry; the row keeps its own name.
        m = dataclasses.replace(m, strategy=job.strategy.name, strategy_knobs=job.strategy.knobs(), cached=True)
        return m, explanation

    def put(self, job: CompileJob, env: dict[str, str], m: Measurement) -> None:
        """Stores an answer (a measurement, or a refusal over HBM); a cache that cannot be written
        is skipped silently."""
        if not m.answered:
            return
        if not m.cached:
            self._record_time(job, m)
        key = key_fields(job, env)
        record = dataclasses.replace(m, cached=False).to_dict()
        self._write(key, {"key": key, "checksum": _digest(record), "measurement": record})

    def _write(self, key: dict[str, Any], entry: dict[str, Any]) -> None:
        """Atomically: a temporary file in the same directory, then a rename."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".entry-", suffix=".part")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, default=str)
            os.replace(tmp, self._path(key))
        except OSError:
            pass

    @property
    def _times_path(self) -> Path:
        return self.directory / "compile-times.jsonl"

    def _record_time(self, job: CompileJob, m: Measurement) -> None:
        if m.process_seconds is None:
            return
        line = json.dumps({"work": _work(job), "seq": job.shapes.seq_len, "batch": job.shapes.batch_per_device,
                           "seconds": round(m.process_seconds, 1), "when": int(time.time())})
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self._times_path, "a") as f:  # one short line per append: whole, in any order
                f.write(line + "\n")
            if self._times_path.stat().st_size > TIMES_COMPACT_BYTES:
                self._compact_times()
        except OSError:
            pass

    def _compact_times(self) -> None:
        """Rewrites the log with only what ``last_times`` can answer from: the latest line of
        each work at each shape, the newest ``TIMES_KEPT`` of them. Atomic, like an entry; a
        line appended by another process meanwhile may be lost, which costs one hint."""
        latest: dict[tuple, tuple[int, str]] = {}
        for line in self._times_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                t = json.loads(line)
                where, when = (t["work"], int(t["seq"]), int(t["batch"])), int(t["when"])
            except (ValueError, KeyError, TypeError):
                continue
            if where not in latest or when >= latest[where][0]:
                latest[where] = (when, line)
        kept = sorted(latest.values())[-TIMES_KEPT:]
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".times-", suffix=".part")
        with os.fdopen(fd, "w") as f:
            f.writelines(line + "\n" for _, line in kept)
        os.replace(tmp, self._times_path)

    def last_time(self, job: CompileJob) -> tuple[float, int, int] | None:
        """How long the compile process of the same work (model, strategy knobs, target and
        devices, step) took last on this machine: (seconds, seq, batch), at the same shapes
        when it was compiled at them, else at the shapes nearest in tokens per device; None
        when it never was."""
        return self.last_times([job])[0]

    def last_times(self, jobs: list[CompileJob]) -> list[tuple[float, int, int] | None]:
        """``last_time`` of each job, the log read once for them all."""
        try:
            lines = self._times_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return [None] * len(jobs)
        records = []
        for line in lines:
            try:
                t = json.loads(line)
                records.append((t["work"], int(t["seq"]), int(t["batch"]), float(t["seconds"]), int(t["when"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short or from another version: not a reason to fail
        answers = []
        for job in jobs:
            work, seq, batch = _work(job), job.shapes.seq_len, job.shapes.batch_per_device
            best = None
            for r_work, r_seq, r_batch, seconds, when in records:
                if r_work != work or r_seq < 1 or r_batch < 1:
                    continue
                distance = abs(math.log(r_seq * r_batch / (seq * batch)))
                rank = ((r_seq, r_batch) != (seq, batch), round(distance, 6), -when)
                if best is None or rank < best[0]:
                    best = (rank, (seconds, r_seq, r_batch))
            answers.append(best[1] if best else None)
        return answers

    def put_explained(self, job: CompileJob, env: dict[str, str], m: Measurement, explanation: dict) -> None:
        if not m.ok:
            return
        self.put(job, env, m)  # the figures answer `compare` too
        key = {**key_fields(job, env), "explain": EXPLAIN_FORMAT}
        record = dataclasses.replace(m, cached=False).to_dict()
        self._write(key, {"key": key, "checksum": _digest([record, explanation]), "measurement": record,
                          "explanation": explanation})
