"""Models of the user's own: `--model my-model.toml`, a preset with some sizes changed or
every size given, read into the same ``ModelConfig`` the presets are.

Kept outside ``memprobe.model`` on purpose: a model's sizes reach the results cache's key
as values, so reading them from a file is no part of the program memprobe compiles, and
changing this module leaves every cached result valid.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from memprobe.errors import BadInput, read_toml, unknown
from memprobe.model._config import PRESETS, AttentionKind, ModelConfig


def is_preset(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` is one of memprobe's presets, as shipped (not a model file's)."""
    return PRESETS.get(cfg.name) == cfg


def pattern_words(kinds: list[str]) -> str:
    """One period of the attention pattern counted by kind: "4 sliding : 1 global"."""
    return " : ".join(f"{kinds.count(k.value)} {k.value}" for k in AttentionKind if k.value in kinds)


def _counted(n: int, thing: str) -> str:
    """'1 layer', '5 layers'."""
    return f"{n:,} {thing}{'s' if n != 1 else ''}"


def describe(cfg: ModelConfig) -> str:
    """Its sizes in one line, as a report names a model of the user's own."""
    pattern = pattern_words([k.value for k in cfg.attention_pattern])
    shared = (f" ({cfg.shared_mlp_hidden:,} on KV-shared layers)"
              if cfg.num_kv_shared_layers and cfg.shared_mlp_hidden not in (None, cfg.mlp_hidden) else "")
    return (f"{_counted(cfg.num_layers, 'layer')}, width {cfg.width:,}, vocab {cfg.vocab_size:,}, "
            f"{_counted(cfg.num_heads, 'head')} ({cfg.num_kv_heads} K/V), head dim {cfg.sliding_head_dim} sliding / "
            f"{cfg.global_head_dim} global, MLP {cfg.mlp_hidden:,}{shared}, pattern {pattern} "
            f"(window {cfg.sliding_window}), {_counted(cfg.num_kv_shared_layers, 'KV-shared layer')}, "
            f"per-layer dim {cfg.per_layer_dim}")


_INT_FIELDS = ("vocab_size", "width", "num_layers", "num_heads", "num_kv_heads", "sliding_head_dim",
               "global_head_dim", "mlp_hidden", "shared_mlp_hidden", "sliding_window", "per_layer_dim")
_FLOAT_FIELDS = ("sliding_rope_base", "global_rope_base", "sliding_rope_fraction", "global_rope_fraction",
                 "final_logit_softcap")
_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "name")
# What a file without a base must give: every size without a default but the shared layers'
# MLP width, which is the others' unless given.
_REQUIRED = tuple(f.name for f in dataclasses.fields(ModelConfig)
                  if f.default is dataclasses.MISSING and f.name not in ("name", "shared_mlp_hidden"))


def model_mapping(cfg: ModelConfig) -> dict:
    """Every size of ``cfg`` as a model file writes it (the attention pattern as words), without
    its name: what a record of a model of the user's own carries, so `memprobe check` can
    compile it again without the file."""
    out = {f: getattr(cfg, f) for f in _FIELDS}
    out["attention_pattern"] = [k.value for k in cfg.attention_pattern]
    if out["shared_mlp_hidden"] is None:
        out["shared_mlp_hidden"] = cfg.mlp_hidden  # the same width; TOML has no null
    return out


#: What each key of a model file sets: the comments of a file `memprobe models --format toml`
#: writes (docs/model.md has the same table, with E2B's values).
KEY_HELP = {
    "vocab_size": "tokens in the vocabulary (embedding and per-layer table rows)",
    "width": "the model width",
    "num_layers": "decoder layers",
    "num_heads": "query heads",
    "num_kv_heads": "K/V heads (a divisor of num_heads)",
    "sliding_head_dim": "head dimension on sliding layers",
    "global_head_dim": "head dimension on global layers",
    "mlp_hidden": "the MLP's hidden width",
    "shared_mlp_hidden": "the MLP's hidden width on KV-shared layers",
    "attention_pattern": "one period of layer kinds, repeated over the layers",
    "sliding_window": "tokens a sliding layer sees",
    "num_kv_shared_layers": "the last layers, which reuse an earlier layer's K/V (0: none)",
    "per_layer_dim": "the per-layer embedding's width per layer",
    "sliding_rope_base": "RoPE base on sliding layers (changes no buffer's size)",
    "global_rope_base": "RoPE base on global layers (changes no buffer's size)",
    "sliding_rope_fraction": "share of head dimensions RoPE turns on sliding layers (no size)",
    "global_rope_fraction": "share of head dimensions RoPE turns on global layers (no size)",
    "final_logit_softcap": "the output soft-cap (changes no buffer's size)",
}


def _toml_value(value) -> str:
    if isinstance(value, str):
        # A JSON string is a TOML basic string once DEL, which TOML wants escaped, is.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)  # int, or a finite float (repr keeps the ".0" TOML needs)


def model_toml(cfg: ModelConfig, parameters: int, source: str, description: str | None = None) -> str:
    """``cfg`` as a model file with every size written out and each key explained: a file to
    save under a name of one's own and edit. Read back, it is ``cfg`` to the last size."""
    lines = [f"# A memprobe model file: every size of {cfg.name} ({source}), {parameters:,} parameters.",
             "# The file's name (less .toml) names the model: save it as, say, my-model.toml, change the",
             "# sizes that differ, and check it without compiling: memprobe models --model my-model.toml",
             "# (A file can also name a preset as base = \"...\" and only the sizes that differ from it.)",
             f"description = {_toml_value(description if description is not None else f'every size of {cfg.name}')}"]
    values = model_mapping(cfg)
    lines += [f"{k} = {_toml_value(v)}".ljust(32) + f"  # {KEY_HELP[k]}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def file_description(path: str) -> str | None:
    """The free-text ``description`` of a model file (one :func:`load_model_file` accepted)."""
    description = read_toml(Path(path), "model file").get("description")
    return description if isinstance(description, str) else None


def model_from_mapping(name: str, data: dict, where: str) -> ModelConfig:
    """A model from a file's keys: ``base`` (a preset) and the sizes that differ from it, or,
    without ``base``, every size. Nothing is derived: a size not named is the base's as is.
    Whatever cannot build a Gemma 4 small model is refused in one line naming ``where``."""
    if name in PRESETS:
        raise BadInput(f"{where}: a model file is named by its file name, and {name!r} is a preset's; "
                       "rename the file")
    extra = sorted(set(data) - {*_FIELDS, "base", "description"})
    if extra == ["name"]:
        raise BadInput(f"{where}: unknown key 'name': a model file is named by its file name, so this one is "
                       f"{name!r}; leave the key out")
    if extra:
        raise unknown("key", extra[0], ["base", "description", *_FIELDS], f"{where}: ")
    if "description" in data and not isinstance(data["description"], str):
        raise BadInput(f"{where}: description: expected a string, got {data['description']!r}")
    values: dict = {}
    if "base" in data:
        if not isinstance(data["base"], str) or data["base"] not in PRESETS:
            raise unknown("base model", data["base"], PRESETS, f"{where}: base: ")
        values = model_mapping(PRESETS[data["base"]])
    else:
        missing = [f for f in _REQUIRED if f not in data]
        if missing:
            raise BadInput(f"{where}: missing key {missing[0]!r} (or start from a preset: base = \"gemma4-e2b\")")
    values.update({k: v for k, v in data.items() if k in _FIELDS})
    for field in _INT_FIELDS:
        if field in values and (isinstance(values[field], bool) or not isinstance(values[field], int)
                                or values[field] < 1):
            raise BadInput(f"{where}: {field}: expected a positive integer, got {values[field]!r}")
    shared = values.get("num_kv_shared_layers")
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise BadInput(f"{where}: num_kv_shared_layers: expected an integer >= 0, got {shared!r}")
    for field in _FLOAT_FIELDS:
        if field not in values:
            continue
        value = values[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadInput(f"{where}: {field}: expected a number, got {value!r}")
        low_ok = value >= 0 if field.endswith("fraction") else value > 0
        if not low_ok or (field.endswith("fraction") and value > 1):
            need = "between 0 and 1" if field.endswith("fraction") else "above 0"
            raise BadInput(f"{where}: {field}: expected a number {need}, got {value!r}")
        values[field] = float(value)
    pattern = values["attention_pattern"]
    kinds = [k.value for k in AttentionKind]
    if not isinstance(pattern, list) or not pattern or not all(isinstance(k, str) for k in pattern):
        raise BadInput(f"{where}: attention_pattern: expected a list of {' or '.join(map(repr, kinds))}, "
                       f"got {pattern!r}")
    for k in pattern:
        if k not in kinds:
            raise unknown("attention kind", k, kinds, f"{where}: attention_pattern: ")
    values["attention_pattern"] = tuple(AttentionKind(k) for k in pattern)
    values.setdefault("shared_mlp_hidden", None)
    if values["shared_mlp_hidden"] == values["mlp_hidden"]:
        values["shared_mlp_hidden"] = None
    if values["num_heads"] % values["num_kv_heads"]:
        raise BadInput(f"{where}: num_heads {values['num_heads']} is not a multiple of num_kv_heads "
                       f"{values['num_kv_heads']} (each K/V head serves a group of query heads)")
    if values["num_kv_shared_layers"] >= values["num_layers"]:
        raise BadInput(f"{where}: num_kv_shared_layers {values['num_kv_shared_layers']} leaves no layer of "
                       f"the {values['num_layers']} to compute the K/V they share")
    cfg = ModelConfig(name=name, **values)
    try:
        cfg.donor_layers  # every KV-shared layer needs an unshared layer of its kind before it
    except ValueError as e:
        raise BadInput(f"{where}: {str(e).removeprefix(name + ': ')}") from None
    return cfg


def load_model_file(path: Path) -> ModelConfig:
    """Reads one model file; its name is the file's stem."""
    path = Path(path)
    data = read_toml(path, "model file")
    return model_from_mapping(path.stem, data, str(path))
