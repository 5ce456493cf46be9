"""`memprobe models`: the presets, or the models named, with their sizes and parameter count."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from memprobe.model import PRESETS
from memprobe.errors import BadInput
from memprobe.model_file import file_description, model_mapping, model_toml, pattern_words
from memprobe.plan import resolve_model
from memprobe.render import ModelFormat, terminal_width
from memprobe.render.columns import Column, fitted_table


def list_models(model: Annotated[list[str] | None, typer.Option(
        "--model", metavar="<name|file>", help="Show this preset or model file (repeatable; default: "
        "every preset). A model file that cannot build a model is refused in one line, so this "
        "checks one before a long compile.")] = None,
                fmt: Annotated[ModelFormat, typer.Option(
                    "--format", help="table; json: one object per model with every size, as a model file "
                    "writes it, and its parameter count; toml: the one model named, every size written out "
                    "with what it sets, as a model file to save and edit.")] = ModelFormat.TABLE) -> int:
    """List the model presets, or the presets and model files given, with their sizes and
    parameter counts (counted from shapes; nothing is compiled)."""
    if fmt is ModelFormat.TOML:
        if len(set(model or [])) != 1:
            raise BadInput("--format toml writes one model file: name one model with --model "
                           "(memprobe models --model gemma4-e2b --format toml > my-model.toml)")
        [name] = set(model)
        cfg = resolve_model(name)
        from memprobe.build import parameter_count  # JAX: only once the name is known good

        preset = name in PRESETS
        sys.stdout.write(model_toml(cfg, parameter_count(cfg), "a memprobe preset" if preset else f"model file {name}",
                                    None if preset else file_description(name)))
        return 0
    rows = model_rows(model or list(PRESETS))
    if fmt is ModelFormat.JSON:
        print(json.dumps(rows, indent=2))
        return 0
    columns = [Column("model", justify="left"), Column("parameters", justify="right"),
               Column("layers", justify="right"), Column("width", justify="right"),
               Column("vocab", justify="right"), Column("heads (K/V)", justify="left", drop=3),
               Column("head dim", justify="left", drop=2), Column("MLP", justify="left", wrap=True),
               Column("pattern", justify="left", wrap=True, drop=4), Column("window", justify="right", drop=5),
               Column("KV-shared", justify="right", drop=6), Column("per-layer", justify="right", drop=7),
               Column("source", justify="left", wrap=True, drop=1)]
    cells = []
    for r in rows:
        mlp = f"{r['mlp_hidden']:,}" + (f" ({r['shared_mlp_hidden']:,} shared)"
                                         if r["shared_mlp_hidden"] != r["mlp_hidden"] else "")
        cells.append([r["name"], f"{r['parameter_count']:,}", str(r["num_layers"]), f"{r['width']:,}",
                      f"{r['vocab_size']:,}", f"{r['num_heads']} ({r['num_kv_heads']})",
                      f"{r['sliding_head_dim']} / {r['global_head_dim']}", mlp, pattern_words(r["attention_pattern"]),
                      str(r["sliding_window"]), str(r["num_kv_shared_layers"]), str(r["per_layer_dim"]),
                      r["source"]])
    caption = ("head dim: sliding / global layers. MLP: the hidden width (on KV-shared layers where it "
               "differs). pattern: one period of attention kinds. KV-shared: the last layers, which reuse "
               "an earlier layer's K/V. per-layer: the per-layer embedding's width. parameters: counted from "
               "the shapes. A model file of your own: --model my-model.toml (docs/model.md).")
    width = terminal_width(sys.stdout, piped=200)
    Console(width=width).print(fitted_table("memprobe models", columns, [[escape(c) for c in row] for row in cells],
                                            [caption], width, full=None))
    return 0


def model_rows(names: list[str]) -> list[dict[str, Any]]:
    """Each model named (a preset or a model file), every size as a model file writes it,
    its parameter count and where it comes from: what the table shows and JSON writes."""
    from memprobe.build import parameter_count  # JAX: only once every name is known good

    configs = {}
    for name in names:
        cfg = resolve_model(name)
        configs.setdefault(cfg.name, (cfg, "preset" if name in PRESETS else name))
    return [{"name": cfg.name, "source": source, "parameter_count": parameter_count(cfg), **model_mapping(cfg)}
            for cfg, source in configs.values()]
