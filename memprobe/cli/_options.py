"""Options shared by the commands that compile: one definition each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memprobe.plan import Optimizer, ParamDtype, Step
from memprobe.render import FROM_SUFFIX, Format
from memprobe.targets import DEFAULT_TARGET

Seq = Annotated[int, typer.Option("--seq", help="Sequence length (tokens per example).")]
Batch = Annotated[int, typer.Option("--batch", help="Per-device batch (MaxText's per_device_batch_size; of each "
                                    "microbatch with --grad-accum).")]
Seqs = Annotated[str, typer.Option("--seq", metavar="<int>[,<int>...]", help="Sequence length (tokens per example); "
                                   "several, comma-separated, compare the strategies at each (a sweep).")]
Batches = Annotated[str, typer.Option("--batch", metavar="<int>[,<int>...]", help="Per-device batch (MaxText's "
                                      "per_device_batch_size; of each microbatch with --grad-accum); several, "
                                      "comma-separated, compare the strategies at each.")]
Model = Annotated[str, typer.Option("--model", metavar="<name|file>", help="Model preset: gemma4-e2b, gemma4-e4b, or "
                                    "tiny-e2b, tiny-e4b, small-deep for quick trials; or a model file of your own "
                                    "(my-model.toml: a preset with some sizes changed, see docs/model.md).")]
TARGET_NAMES = ("tpu7x, v6e, v5p, v5e, v4 (deviceless TPU; with its size as v5p:2x2x1 or as a Cloud TPU "
                "accelerator type, v5p-8), h100, h200, b200, b300, gb200, gb300, a100, h100-pcie, a100-40gb, "
                "rtx-pro-6000 (deviceless GPU: the gpu extra) or cpu")
TARGET_DEFAULT = f"Default: {DEFAULT_TARGET}, or the TPU kind that --topology names (v5p of v5p:2x2x1)."
Target = Annotated[str | None, typer.Option("--target", metavar="<name>", help=f"{TARGET_NAMES}. {TARGET_DEFAULT}")]
Targets = Annotated[str | None, typer.Option(
    "--target", metavar="<name>[,<name>...]",
    help=f"{TARGET_NAMES}; several, comma-separated, compare the strategies on each. {TARGET_DEFAULT}")]
Devices = Annotated[int | None, typer.Option("--devices", help="Device count (default: the target's).")]
Topology = Annotated[str | None, typer.Option(
    "--topology", metavar="<topology>", help="TPU topology, e.g. v5p:2x2x1, or 2x2x1 in --target's kind.")]
Strategies = Annotated[
    str | None,
    typer.Option("--strategies", metavar="<names>", help="Comma-separated strategies (default: the four "
                 "families); 'all' is every built-in, alone or in a list (all,mine). The default and 'all' take in "
                 "your --strategy-file strategies too. The first is the baseline for deltas and FLOPs."),
]
StrategyFile = Annotated[
    list[Path] | None,
    typer.Option("--strategy-file", metavar="<path>", help="A strategy TOML file of your own (repeatable)."),
]
StrategiesDir = Annotated[
    list[Path] | None,
    typer.Option("--strategies-dir", metavar="<dir>", help="A directory of strategy TOML files (repeatable)."),
]
LossChunks = Annotated[
    int | None,
    typer.Option("--loss-chunks", help="Sequence chunks the loss is computed in (default: chunks of <= 512 tokens)."),
]
StepKind = Annotated[Step, typer.Option(
    "--step", help="train: forward, backward and the optimizer update; grad: loss and gradients only.")]
OptimizerKind = Annotated[Optimizer | None, typer.Option(
    "--optimizer", help="The train step's update: adamw (default; two moments per parameter), adafactor "
    "(a factored second moment), lion (one moment), sgd (no momentum, no state).")]
ParamDtypeKind = Annotated[ParamDtype, typer.Option(
    "--param-dtype", help="How the parameters are stored: fp32, or bf16 (the optimizer's moments follow "
    "them). Activations are bf16 either way.")]
GradAccum = Annotated[int, typer.Option(
    "--grad-accum", help="Microbatches one step accumulates gradients over, one after another (MaxText's "
    "gradient_accumulation_steps); --batch is each microbatch's per-device batch; 1: no accumulation.")]
Timeout = Annotated[float, typer.Option(
    "--timeout", metavar="<seconds>", help="Seconds one strategy's compile may take.")]

Jobs = Annotated[int | None, typer.Option(
    "--jobs", help="Strategies compiled at once, each in its own process (default: one per core, "
    "as many as free host memory holds at 10 GiB each).")]
NoCache = Annotated[bool, typer.Option(
    "--no-cache", help="Compile every strategy again instead of answering from the results cache "
    "($MEMPROBE_CACHE_DIR, else ~/.cache/memprobe).")]


def format_option(choices: str, default: str):
    """A --format that, left out, follows the --output file's suffix, else ``default``."""
    return typer.Option("--format", help=f"{choices}. {FROM_SUFFIX}, else {default}; given, it must agree "
                        "with that suffix.", show_default=False)


RESULT_FORMATS = "table (terminal), markdown (pull request), json (the result schema), csv, html (with chart)"
FormatOpt = Annotated[Format | None, format_option(RESULT_FORMATS, "table")]
ReportFormatOpt = Annotated[Format | None, format_option(RESULT_FORMATS, "markdown")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write the result to this file "
                                             "instead of standard output (- is standard output).")]
Chart = Annotated[Path | None, typer.Option(
    "--chart", help="Also save a chart (PNG; SVG or PDF for a .svg or .pdf file): per strategy, the peak's parts "
    "stacked, HBM capacity as a line; one per shape of a sweep (or target) (FILE-1.png, ...) and FILE-sweep.png, "
    "each strategy's peak across them.")]
MaxHostMemory = Annotated[str | None, typer.Option(
    "--max-host-memory", metavar="<size>", help="Host memory one compile process may use before it is stopped and "
    "its row marked failed, e.g. 12GiB (default: 90% of this machine's memory).")]
HostRam = Annotated[str | None, typer.Option(
    "--host-ram", metavar="<size>", help="RAM of one accelerator host, e.g. 1TiB: a row whose host GiB (offload), "
    "times the devices that share the host, exceeds it is judged 'over host RAM'. Not checked without it.")]
DevicesPerHost = Annotated[int | None, typer.Option(
    "--devices-per-host", help="Devices that share one host's RAM, for --host-ram (default: TPU as "
    "libtpu lays hosts out, 2x2 chips; GPU the devices up to 8; an 8-chip single-host v5e/v6e VM needs 8).")]

