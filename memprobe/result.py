"""The versioned JSON result: the one record every format is rendered from.

A result holds measurements (one per strategy and configuration), the command that made
them (one per line when results were merged) and when. Each measurement carries its whole
configuration (model, target, topology, shapes, step, strategy knobs), every memory field,
FLOPs, timings and the versions it was compiled with; the sanity flags and the FLOPs ratio
are stored too, so a reader need not recompute them. ``memprobe report`` re-renders a result, ``memprobe
check`` recompiles a result used as a baseline.

Schema ``memprobe.result`` version 1::

    {"schema": "memprobe.result", "schema_version": 1, "created": ISO-8601 UTC,
     "command": "memprobe compare ...", "memprobe": "0.1.0",
     "comparisons": [{"config": {...}, "rows": [{measurement fields..., "flags": [...],
                      "flops_ratio": float | null}]}]}
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from memprobe.errors import BadInput
from memprobe.flags import sanity_flags
from memprobe.measure import Measurement, flops_ratio
from memprobe.model_file import model_from_mapping
from memprobe.plan import Optimizer, ParamDtype, Step

SCHEMA = "memprobe.result"
SCHEMA_VERSION = 1
CONFIG_FIELDS = ("model", "target", "platform", "num_devices", "topology", "seq_len",
                 "batch_per_device", "loss_chunks", "step", "optimizer", "param_dtype", "grad_accum")


def config_of(m: Measurement) -> dict[str, Any]:
    return {f: getattr(m, f) for f in CONFIG_FIELDS}


SHAPE_FIELDS = ("seq_len", "batch_per_device", "loss_chunks")
TARGET_FIELDS = ("target", "platform", "num_devices", "topology")


def setting_of(m: Measurement, varied: tuple[str, ...] = SHAPE_FIELDS) -> dict[str, Any]:
    """A configuration but its ``varied`` fields (its shape, by default): what the
    comparisons of a sweep have in common."""
    return {**{k: v for k, v in config_of(m).items() if k not in varied}, "model_config": m.model_config}


def config_key(m: Measurement) -> str:
    """One string per configuration: the rows that share it make one table. Two model files
    of one name but different sizes are two configurations."""
    extra = {"model_config": m.model_config} if m.model_config is not None else {}
    return json.dumps({**config_of(m), **extra}, sort_keys=True)


def group_by_config(measurements: list[Measurement]) -> list[list[Measurement]]:
    """Measurements split by configuration, first-seen order kept (one table each)."""
    groups: dict[str, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault(config_key(m), []).append(m)
    return list(groups.values())


def now() -> str:
    """When a result was made: ISO-8601 UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass
class Result:
    measurements: list[Measurement]
    command: str | None = None
    created: str = dataclasses.field(default_factory=lambda: now())

    @property
    def comparisons(self) -> list[list[Measurement]]:
        return group_by_config(self.measurements)

    def to_json(self) -> dict[str, Any]:
        comparisons = []
        for group in self.comparisons:
            flags = sanity_flags(group)
            rows = []
            for m in group:
                row = m.to_dict()
                row["flags"] = [{"kind": f.kind, "reason": f.reason} for f in flags[m.strategy]]
                row["flops_ratio"] = flops_ratio(m, group[0])
                rows.append(row)
            comparisons.append({"config": config_of(group[0]), "rows": rows})
        try:
            version = importlib.metadata.version("memprobe")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": self.created,
                "command": self.command, "memprobe": version, "comparisons": comparisons}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, data: Any, where: str = "result") -> Result:
        """Reads a result; anything malformed is refused in one line naming what is wrong."""
        comparisons = saved_list(data, where, SCHEMA, "result", "comparisons")
        measurements = []
        for i, comp in enumerate(comparisons):
            rows = comp.get("rows") if isinstance(comp, dict) else None
            if not isinstance(rows, list) or not rows:
                raise BadInput(f"{where}: comparisons[{i}].rows: expected a non-empty list")
            measurements += [measurement_from_json(row, f"{where}: comparisons[{i}].rows[{j}]")
                             for j, row in enumerate(rows)]
        return cls(measurements, command=data.get("command"), created=data.get("created") or "")

    @classmethod
    def load(cls, path: Path) -> Result:
        return cls.from_json(read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        """Writes the JSON that ``load``, `memprobe report` and `memprobe check` read."""
        save_json(path, self.to_json(), "result", ("table", "markdown", "csv", "html"))

    @classmethod
    def merge(cls, results: list[tuple[str, Result]]) -> Result:
        """Several results as one: rows of the same configuration join one table, so
        strategies compiled in separate runs compare side by side. A strategy measured twice
        for one configuration, or rows of one table from different compiler versions, are
        refused: a table must not hide which figure it shows or mix two compilers' figures."""
        if len(results) == 1:
            return results[0][1]
        seen: dict[tuple[str, str], str] = {}  # (configuration, strategy) -> the file it came from
        compilers: dict[str, tuple[str, dict]] = {}  # configuration -> its first compiled row's file, versions
        measurements, commands = [], []
        for where, result in results:
            for m in result.measurements:
                config = config_key(m)
                if (config, m.strategy) in seen:
                    raise BadInput(f"{where}: strategy {m.strategy!r} ({m.model}, seq {m.seq_len} x "
                                   f"per-device batch {m.batch_per_device}, {m.topology or m.target}) "
                                   f"is in {seen[config, m.strategy]} too")
                seen[config, m.strategy] = where
                if m.answered:  # a failed row compiled nothing
                    compiler = {k: v for k, v in m.versions.items() if k != "memprobe"}
                    first, first_compiler = compilers.setdefault(config, (where, compiler))
                    if compiler != first_compiler:
                        raise BadInput(f"{where}: {m.strategy} was compiled with {_versions(compiler)}, "
                                       f"the same configuration in {first} with {_versions(first_compiler)}")
                measurements.append(m)
            for line in (result.command or "").splitlines():
                if line not in commands:
                    commands.append(line)
        created = max(r.created for _, r in results)
        return cls(measurements, command="\n".join(commands) or None, created=created)


def _versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))


def saved_list(data: Any, where: str, schema: str, kind: str, key: str) -> list:
    """The non-empty list under ``key`` of a saved memprobe ``kind`` of ``schema``, version 1;
    anything else is refused in one line."""
    if not isinstance(data, dict):
        raise BadInput(f"{where}: not a memprobe {kind} (expected a JSON object)")
    if data.get("schema") != schema:
        found = f"schema {data['schema']!r}" if "schema" in data else 'no "schema" field'
        raise BadInput(f"{where}: not a memprobe {kind} ({found}; expected {schema!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{where}: schema_version {data.get('schema_version')!r} is not supported "
                       f"(this memprobe reads {SCHEMA_VERSION})")
    listed = data.get(key)
    if not isinstance(listed, list) or not listed:
        raise BadInput(f"{where}: {key}: expected a non-empty list")
    return listed


STATUSES = ("ok", "refused", "failed")
_REQUIRED = {"model", "strategy", "strategy_knobs", "target", "platform", "num_devices", "seq_len",
             "batch_per_device", "loss_chunks", "step", "status"}


_ALLOCATION_FIELDS = {"size": str, "values": int, "shapes": str, "heap": bool}


def _check_oom_allocations(listed: Any, at: str) -> None:
    """A refused row's allocations from the compiler's report: absent, null or a list of
    objects with exactly ``_ALLOCATION_FIELDS``."""
    if listed is None:
        return
    if not isinstance(listed, list):
        raise BadInput(f"{at}: expected a list, got {listed!r}")
    for i, a in enumerate(listed):
        if not isinstance(a, dict) or set(a) != set(_ALLOCATION_FIELDS):
            raise BadInput(f"{at}[{i}]: expected an object with {', '.join(_ALLOCATION_FIELDS)}, got {a!r}")
        for field, kind in _ALLOCATION_FIELDS.items():
            if not isinstance(a[field], kind) or (kind is int and isinstance(a[field], bool)):
                raise BadInput(f"{at}[{i}]: {field}: expected {kind.__name__}, got {a[field]!r}")


def measurement_from_json(row: Any, at: str) -> Measurement:
    """One saved measurement (a result's row, an explain answer's); anything malformed is
    refused in one line naming ``at`` and what is wrong."""
    if not isinstance(row, dict):
        raise BadInput(f"{at}: expected an object")
    missing = sorted(_REQUIRED - set(row))
    if missing:
        raise BadInput(f"{at}: missing field {missing[0]!r}")
    for field in ("model", "strategy", "target", "platform", "step", "status"):
        if not isinstance(row[field], str):
            raise BadInput(f"{at}: {field}: expected a string, got {row[field]!r}")
    for field in ("num_devices", "seq_len", "batch_per_device", "loss_chunks"):
        if isinstance(row[field], bool) or not isinstance(row[field], int):
            raise BadInput(f"{at}: {field}: expected an integer, got {row[field]!r}")
    if row["status"] not in STATUSES:
        raise BadInput(f"{at}: status: {row['status']!r} is not one of {', '.join(STATUSES)}")
    needed = row.get("needed_bytes")
    if row["status"] == "refused" and (isinstance(needed, bool) or not isinstance(needed, int) or needed <= 0):
        raise BadInput(f"{at}: needed_bytes: a refused row needs the bytes the compiler needed, got {needed!r}")
    _check_oom_allocations(row.get("oom_allocations"), f"{at}: oom_allocations")
    if row["step"] not in {s.value for s in Step}:
        raise BadInput(f"{at}: step: {row['step']!r} is not one of {', '.join(s.value for s in Step)}")
    row = {"param_dtype": ParamDtype.FP32.value,  # saved before these knobs existed: AdamW, fp32,
           "optimizer": Optimizer.ADAMW.value if row["step"] == Step.TRAIN.value else None,
           "grad_accum": 1, **row}  # no accumulation
    if isinstance(row["grad_accum"], bool) or not isinstance(row["grad_accum"], int) or row["grad_accum"] < 1:
        raise BadInput(f"{at}: grad_accum: expected a positive integer, got {row['grad_accum']!r}")
    for field, kind in (("optimizer", Optimizer), ("param_dtype", ParamDtype)):
        known = [k.value for k in kind]
        if field == "optimizer" and row["step"] != Step.TRAIN.value:
            if row[field] is not None:
                raise BadInput(f"{at}: optimizer: a {row['step']} step has none, got {row[field]!r}")
        elif row[field] not in known:
            raise BadInput(f"{at}: {field}: {row[field]!r} is not one of {', '.join(known)}")
    for field in ("strategy_knobs", "versions", "model_config"):
        if not isinstance(row.get(field, {}), dict) and not (field == "model_config" and row[field] is None):
            raise BadInput(f"{at}: {field}: expected an object")
    if row.get("model_config") is not None:  # a model file's sizes: the model must build from them
        model_from_mapping(row["model"], row["model_config"], f"{at}: model_config")
    for field in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes"):
        value = row.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadInput(f"{at}: {field}: expected a byte count, got {value!r}")
    try:
        return Measurement.from_dict(row)  # which keeps only Measurement's fields
    except TypeError as e:
        raise BadInput(f"{at}: {e}") from None


def save_json(path: str | Path, data: dict, what: str, formats: tuple[str, ...], chart: bool = True) -> None:
    """Writes a saved memprobe result (``data``) as JSON to ``path``. A suffix naming another
    format or a picture is refused: `result.save("e2b.md")` wrote JSON into a .md file, where
    the command line's `-o e2b.md` writes markdown. The message says how to write what the
    suffix names: ``memprobe.report(what, ...)`` in one of ``formats``, or, where ``chart``,
    `memprobe report --chart`."""
    from memprobe.render import suffix_format

    path = Path(path)
    name = suffix_format(path)
    if name not in (None, "json"):
        if name == "picture" and chart:
            hint = f"`memprobe report {path.with_suffix('.json')} --chart {path}` draws the chart"
        elif name in formats:
            hint = f"memprobe.report({what}, {name!r}, file=...) writes {name}"
        else:
            hint = f"memprobe.report({what}, ...) writes {', '.join(formats[:-1])} or {formats[-1]}"
        raise BadInput(f"{path}: save writes JSON, not the {name} its {path.suffix} suffix names; {hint}")
    path.write_text(json.dumps(data, indent=2) + "\n")


def read_json(path: Path) -> Any:
    """A JSON file the user named; a missing or unreadable one is refused in one line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not valid JSON (not UTF-8 text: byte {e.object[e.start]:#04x} at offset "
                       f"{e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    return data
