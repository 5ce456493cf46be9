"""What to compile: model x strategies x target x shapes, checked before anything compiles."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from pathlib import Path

from memprobe.errors import BadInput, unknown
from memprobe.model._config import PRESETS, ModelConfig, attention_block_size, default_loss_chunks
from memprobe.model_file import load_model_file
from memprobe.strategy import Strategy
from memprobe.targets import Target

DEFAULT_MODEL = "gemma4-e2b"


class Step(str, enum.Enum):
    TRAIN = "train"  # forward + backward + AdamW update, parameters and state donated
    GRAD = "grad"  # loss and gradients only


class Optimizer(str, enum.Enum):
    """The update a train step compiles; what it keeps per parameter decides its state's size."""

    ADAMW = "adamw"  # two moments, each the parameters' shape and dtype
    ADAFACTOR = "adafactor"  # factored second moment (a row and a column per matrix), no first
    LION = "lion"  # one moment, the parameters' shape and dtype
    SGD = "sgd"  # plain SGD, no momentum: no state at all

    @property
    def label(self) -> str:
        return {"adamw": "AdamW", "adafactor": "Adafactor", "lion": "Lion", "sgd": "SGD"}[self.value]


class ParamDtype(str, enum.Enum):
    """How the parameters are stored; the optimizer's moments follow them (optax's default)."""

    FP32 = "fp32"
    BF16 = "bf16"


def recipe(step: str, optimizer: str | None, param_dtype: str, grad_accum: int = 1) -> str:
    """The parameters' dtype, the update and the accumulation, as reports name them: "fp32
    parameters, AdamW" (a grad step has no update to name), "..., gradients accumulated over
    4 microbatches"."""
    update = f", {Optimizer(optimizer).label}" if step == Step.TRAIN.value and optimizer else ""
    accum = f", gradients accumulated over {grad_accum} microbatches" if grad_accum > 1 else ""
    return f"{param_dtype} parameters{update}{accum}"


INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Per-step shapes. ``batch_per_device`` is MaxText's per_device_batch_size."""

    seq_len: int
    batch_per_device: int
    loss_chunks: int

    def __post_init__(self):
        for field in ("seq_len", "batch_per_device", "loss_chunks"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInput(f"{_flag(field)} must be a positive integer, got {value!r}")
        if self.seq_len > INT32_MAX:  # the compile aborted ("DilatedBound overflow")
            raise BadInput(f"--seq {self.seq_len}: over {INT32_MAX:,}, the longest sequence whose positions "
                           "JAX's default integer (int32) can number")
        block = attention_block_size(self.seq_len)  # the whole length when under 512: always valid
        if self.seq_len % block:
            below = self.seq_len // block * block
            raise BadInput(f"--seq {self.seq_len} is not a multiple of the attention block "
                           f"({block}); try {below} or {below + block}")
        if self.seq_len % self.loss_chunks:
            raise BadInput(f"--loss-chunks {self.loss_chunks} does not divide --seq {self.seq_len}")


def _flag(field: str) -> str:
    return {"seq_len": "--seq", "batch_per_device": "--batch", "loss_chunks": "--loss-chunks"}[field]


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One compile: everything that decides its figures. Plain data, so it crosses processes."""

    model: ModelConfig
    strategy: Strategy
    target: Target
    shapes: Shapes
    step: Step
    optimizer: Optimizer | None = Optimizer.ADAMW  # None for a grad step: no update is compiled
    param_dtype: ParamDtype = ParamDtype.FP32
    grad_accum: int = 1  # microbatches of batch_per_device whose gradients one step sums

    @property
    def global_batch(self) -> int:
        """Examples in one microbatch, all devices together (the whole batch without accumulation)."""
        return self.shapes.batch_per_device * self.target.num_devices


@dataclasses.dataclass(frozen=True)
class Plan:
    model: ModelConfig
    strategies: tuple[Strategy, ...]
    target: Target
    shapes: Shapes
    step: Step
    optimizer: Optimizer | None = Optimizer.ADAMW
    param_dtype: ParamDtype = ParamDtype.FP32
    grad_accum: int = 1

    def job(self, strategy: Strategy, shapes: Shapes | None = None) -> CompileJob:
        """The compile of one strategy of this plan (at other shapes, for a search)."""
        return CompileJob(self.model, strategy, self.target, shapes or self.shapes, self.step,
                          self.optimizer, self.param_dtype, self.grad_accum)

    def jobs(self) -> list[CompileJob]:
        return [self.job(s) for s in self.strategies]

    def jobs_by_strategy(self) -> dict[str, CompileJob]:
        return {job.strategy.name: job for job in self.jobs()}


def choice(kind: type[enum.Enum], value, name: str):
    """``value`` as a member of ``kind``; anything else refused in one line naming ``name``."""
    try:
        return kind(value)
    except ValueError:
        raise BadInput(f"{name}: {value!r} is not one of {', '.join(k.value for k in kind)}") from None


def resolve_model(model: str | ModelConfig) -> ModelConfig:
    """A preset by name, or a model file of the user's own by its path (``*.toml``)."""
    if isinstance(model, ModelConfig):
        return model
    if not isinstance(model, str):
        raise BadInput(f"--model: expected a preset's name or a model file's path, got {model!r}")
    if model in PRESETS:
        return PRESETS[model]
    if model.endswith(".toml") or Path(model).is_file():
        return load_model_file(Path(model))
    if model.lower() in PRESETS:  # Gemma4-E2B, as the model card writes it, is the preset
        return PRESETS[model.lower()]
    raise BadInput(str(unknown("model", model, PRESETS)).removesuffix(")")
                   + "; or a model file of your own, my-model.toml)")


def make_plan(*, model: str | ModelConfig, strategies: list[Strategy], target: Target, seq_len: int,
              batch_per_device: int, loss_chunks: int | None = None, step: Step = Step.TRAIN,
              optimizer: Optimizer | None = None, param_dtype: ParamDtype = ParamDtype.FP32,
              grad_accum: int = 1) -> Plan:
    """``optimizer`` None is AdamW for a train step; a grad step compiles no update, so
    naming one for it is refused rather than silently ignored. ``grad_accum`` microbatches of
    ``batch_per_device`` each make one step (MaxText's gradient_accumulation_steps)."""
    cfg = resolve_model(model)
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise BadInput(f"--grad-accum must be a positive integer, got {grad_accum!r}")
    step, param_dtype = choice(Step, step, "step"), choice(ParamDtype, param_dtype, "param_dtype")
    if step is Step.GRAD:
        if optimizer is not None:
            raise BadInput(f"--optimizer {choice(Optimizer, optimizer, 'optimizer').value}: a grad "
                           "step compiles no optimizer update (use --step train)")
    else:
        optimizer = choice(Optimizer, optimizer or Optimizer.ADAMW, "optimizer")
    if not strategies:
        raise BadInput("--strategies: choose at least one strategy")
    for s in strategies:
        if s.offload and not target.has_host_memory:
            raise BadInput(f"{s.where}: offload: target {target.name} has no host memory space "
                           "to offload to")
    shapes = make_shapes(seq_len, batch_per_device, loss_chunks)
    check_tokens(shapes.seq_len, shapes.batch_per_device, target.num_devices, grad_accum,
                 f"--batch {shapes.batch_per_device}")
    return Plan(cfg, tuple(strategies), target, shapes, step, optimizer, param_dtype, grad_accum)


def check_tokens(seq_len: int, batch_per_device: int, num_devices: int, grad_accum: int, what: str) -> None:
    """Refuses a step whose tokens (every microbatch, all devices) no XLA shape holds: the
    compile failed with a TypeError, or XLA's "overflow in static extent product". ``what``
    names the option to blame ("--batch 8")."""
    if grad_accum * batch_per_device * num_devices * seq_len > INT64_MAX:
        accum = f" x {grad_accum} microbatches" if grad_accum > 1 else ""
        raise BadInput(f"{what}: the step's tokens ({batch_per_device} x {num_devices} devices{accum} x "
                       f"seq {seq_len}) are more than an XLA shape holds ({INT64_MAX:,} elements)")


def make_shapes(seq_len: int, batch_per_device: int, loss_chunks: int | None = None) -> Shapes:
    """Checked shapes; ``loss_chunks`` None is the default for that length (chunks of <= 512)."""
    if isinstance(seq_len, int) and seq_len >= 1 and loss_chunks is None:
        loss_chunks = default_loss_chunks(seq_len)
    return Shapes(seq_len=seq_len, batch_per_device=batch_per_device, loss_chunks=loss_chunks)


def sweep(plan: Plan, seqs: Sequence[int], batches: Sequence[int], loss_chunks: int | None = None) -> list[Plan]:
    """``plan`` at every sequence length of ``seqs`` and per-device batch of ``batches`` (lengths
    outer, in the order given, each pair once): a sweep compares one set of strategies at
    several shapes. Every pair is checked before anything compiles."""
    if not seqs or not batches:
        raise BadInput("--seq and --batch: give at least one value each")
    pairs = dict.fromkeys((s, b) for s in seqs for b in batches)
    return [dataclasses.replace(plan, shapes=make_shapes(s, b, loss_chunks)) for s, b in pairs]


def shape_label(seq_len: int, batch_per_device: int, seqs: int, batches: int) -> str:
    """A shape of a sweep named by what varies across its ``seqs`` lengths and ``batches``
    batches: "seq 8192", "batch 4" or "8192 x 4"."""
    if batches == 1:
        return f"seq {seq_len}"
    if seqs == 1:
        return f"batch {batch_per_device}"
    return f"{seq_len} x {batch_per_device}"


def job_labels(plans: Sequence[Plan]) -> list[str]:
    """What progress calls each compile of ``plans``: the strategy, and in a sweep the shapes
    that vary ("checkpoint @ seq 8192", "checkpoint @ batch 4", "checkpoint @ 8192 x 4"), or
    the target where targets vary ("checkpoint @ h100 (8 devices)")."""
    seqs = len({p.shapes.seq_len for p in plans})
    batches = len({p.shapes.batch_per_device for p in plans})
    targets = len({p.target for p in plans})

    def at(p: Plan) -> str:
        where = [p.target.label] if targets > 1 else []
        if seqs > 1 or batches > 1:
            where.append(shape_label(p.shapes.seq_len, p.shapes.batch_per_device, seqs, batches))
        return "".join(f" @ {w}" for w in where)

    labels = [s.name + at(p) for p in plans for s in p.strategies]
    if len(set(labels)) < len(labels):  # plans that differ in more than shapes and targets (a baseline's)
        labels = [f"{s.name}{at(p)} [{i + 1}]" for i, p in enumerate(plans) for s in p.strategies]
    return labels
