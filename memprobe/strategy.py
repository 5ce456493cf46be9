"""Remat strategies as data: a frozen ``Strategy`` read from a TOML file, and the layer
runner it turns into. A strategy knows the model only by its layer hook and checkpoint names."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from pathlib import Path

from memprobe.errors import BadInput, read_toml, unknown

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "strategies"
# Installed wheels carry the built-in files inside the package.
_PACKAGED_DIR = Path(__file__).resolve().parent / "strategies"

# Kept in step with memprobe.model.CHECKPOINT_NAMES (a test checks), so that reading a
# strategy file does not import JAX.
CHECKPOINT_NAMES = (
    "layer_input", "query_proj", "key_proj", "value_proj", "attention_out", "mlp_hidden", "mlp_out",
)

TRIP_COUNT_ONE_ATTR = "skip-simplify-while-loops_trip-count-one"


class Loop(str, enum.Enum):
    UNROLLED = "unrolled"
    CHECKPOINT = "checkpoint"
    SCAN_CHECKPOINT = "scan-checkpoint"
    SCAN_LAYERS = "scan-layers"


class Policy(str, enum.Enum):
    NOTHING = "nothing_saveable"
    EVERYTHING = "everything_saveable"
    DOTS = "dots_saveable"
    DOTS_NO_BATCH = "dots_with_no_batch_dims_saveable"
    NAMES = "names"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Strategy:
    """How each decoder layer is run in the train step.

    loop: ``unrolled`` calls layers as written; ``checkpoint`` wraps each in
      ``jax.checkpoint``; ``scan-checkpoint`` also puts it in a ``lax.scan(length=1)``;
      ``scan-layers`` stacks the parameters of whole periods of the attention pattern and
      runs the periods as one ``lax.scan``, each layer in ``jax.checkpoint`` inside it.
    policy: what the checkpoint may keep; ``names`` keeps ``save`` on device and moves
      ``offload`` to pinned host memory.
    shared_kv_inside: whether a donor layer's K/V computation is inside its boundary.
    prevent_cse: ``jax.checkpoint``'s flag of that name.
    trip_count_one: mark the one-trip scan so XLA keeps the loop instead of inlining it.
    checkpoint_period: (``scan-layers`` only) also wrap each whole trip of the scan, one
      period of the attention pattern, in ``jax.checkpoint`` saving nothing, so only the
      trip's input crosses from the forward to the backward pass; the per-layer checkpoints
      inside then act while the trip is recomputed.
    """

    name: str
    description: str
    loop: Loop
    policy: Policy = Policy.NOTHING
    save: tuple[str, ...] = ()
    offload: tuple[str, ...] = ()
    shared_kv_inside: bool = False
    prevent_cse: bool = True
    trip_count_one: bool = False
    checkpoint_period: bool = False
    source: str = "built-in"

    def __post_init__(self):
        where = self.source
        for field, names in (("save", self.save), ("offload", self.offload)):
            for n in names:
                if n not in CHECKPOINT_NAMES:
                    raise unknown("tensor name", n, CHECKPOINT_NAMES, f"{where}: {field}: ")
        both = sorted(set(self.save) & set(self.offload))
        if both:
            raise BadInput(f"{where}: {', '.join(both)} both saved and offloaded")
        if (self.save or self.offload) and self.policy is not Policy.NAMES:
            raise BadInput(f"{where}: policy: save/offload lists need policy = \"names\"")
        if self.policy is Policy.NAMES and not (self.save or self.offload):
            raise BadInput(f"{where}: policy: \"names\" needs a save or offload list")
        if self.loop is Loop.UNROLLED and (self.policy is not Policy.NOTHING or self.save
                                           or self.offload or self.trip_count_one):
            raise BadInput(f"{where}: loop: \"unrolled\" has no checkpoint, so policy, save, "
                           "offload and trip_count_one do not apply")
        if self.trip_count_one and self.loop is not Loop.SCAN_CHECKPOINT:
            raise BadInput(f"{where}: trip_count_one: only a scan-checkpoint loop has a one-trip loop")
        if self.checkpoint_period and self.loop is not Loop.SCAN_LAYERS:
            raise BadInput(f"{where}: checkpoint_period: only a scan-layers loop has periods to checkpoint")

    def knobs(self) -> dict[str, object]:
        """The canonical form shown in reports: every knob, explicit."""
        return {
            "loop": self.loop.value,
            "policy": self.policy.value,
            "save": list(self.save),
            "offload": list(self.offload),
            "shared_kv_inside": self.shared_kv_inside,
            "prevent_cse": self.prevent_cse,
            "trip_count_one": self.trip_count_one,
            "checkpoint_period": self.checkpoint_period,
        }

    @property
    def where(self) -> str:
        """The file that defines this strategy, for error messages."""
        return f"strategies/{self.name}.toml" if self.source == "built-in" else self.source

    @property
    def offload_kept_on_device(self) -> bool:
        """Offloaded residuals cannot cross a kept one-trip loop: libtpu 0.0.50 fails with
        INTERNAL errors (a bitcast between memory spaces, a while-loop shape mismatch),
        whether the offload is inside the scan or around it. As MaxText does, such a
        strategy saves those tensors on device instead."""
        return bool(self.offload) and self.loop is Loop.SCAN_CHECKPOINT and self.trip_count_one

    @property
    def stacks_layers(self) -> bool:
        """Whether the model keeps its layer parameters stacked, as a scan-over-layers trainer does."""
        return self.loop is Loop.SCAN_LAYERS

    def as_compiled(self) -> "Strategy":
        """The strategy as it is compiled: offload names saved on device where they must be."""
        if not self.offload_kept_on_device:
            return self
        return dataclasses.replace(self, save=(*self.save, *self.offload), offload=())

    def layer_runner(self):
        """The ``LayerRunner`` that applies this strategy in the model's layer loop."""
        from memprobe.remat import make_layer_runner  # imports JAX: only when building

        return make_layer_runner(self)


_KEYS = {
    "description": str, "loop": str, "policy": str, "save": list, "offload": list,
    "shared_kv_inside": bool, "prevent_cse": bool, "trip_count_one": bool, "checkpoint_period": bool,
}


def _enum(kind, value, where, key):
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise BadInput(f"{where}: {key}: {value!r} is not one of {choices}") from None


def strategy_from_mapping(name: str, data: dict, where: str) -> Strategy:
    extra = sorted(set(data) - set(_KEYS))
    if extra == ["name"]:  # the natural first line of a strategy file, but the file names it
        raise BadInput(f"{where}: unknown key 'name': a strategy file is named by its file name, so this "
                       f"one is {name!r}; leave the key out")
    if extra:
        raise unknown("key", extra[0], _KEYS, f"{where}: ")
    for key, kind in _KEYS.items():
        if key in data and not isinstance(data[key], kind):
            raise BadInput(f"{where}: {key}: expected {kind.__name__}, got {type(data[key]).__name__}")
    for key in ("description", "loop"):
        if key not in data:
            raise BadInput(f"{where}: missing key {key!r}")
    for key in ("save", "offload"):
        if not all(isinstance(n, str) for n in data.get(key, [])):
            raise BadInput(f"{where}: {key}: expected a list of tensor names")
    return Strategy(
        name=name,
        description=data["description"],
        loop=_enum(Loop, data["loop"], where, "loop"),
        policy=_enum(Policy, data.get("policy", Policy.NOTHING.value), where, "policy"),
        save=tuple(data.get("save", ())),
        offload=tuple(data.get("offload", ())),
        shared_kv_inside=data.get("shared_kv_inside", False),
        prevent_cse=data.get("prevent_cse", True),
        trip_count_one=data.get("trip_count_one", False),
        checkpoint_period=data.get("checkpoint_period", False),
        source=where,
    )


def load_strategy(path: Path) -> Strategy:
    """Reads one strategy file; its name is the file's stem."""
    path = Path(path)
    data = read_toml(path, "strategy file")
    return strategy_from_mapping(path.stem, data, str(path))


def builtin_dir() -> Path:
    return BUILTIN_DIR if BUILTIN_DIR.is_dir() else _PACKAGED_DIR


# The order the four families are shown in: the baseline first.
DEFAULT_STRATEGIES = ("unrolled", "checkpoint", "scan-checkpoint", "offload")


def load_catalogue(extra_files: Iterable[Path] = (), extra_dirs: Iterable[Path] = ()) -> dict[str, Strategy]:
    """Built-in strategies, then the user's; a user strategy may not shadow another."""
    found: dict[str, Strategy] = {}
    built_in = sorted(builtin_dir().glob("*.toml"))
    ordered = sorted(built_in, key=lambda p: (DEFAULT_STRATEGIES.index(p.stem)
                                              if p.stem in DEFAULT_STRATEGIES else 99, p.stem))
    for p in ordered:
        s = load_strategy(p)
        found[s.name] = dataclasses.replace(s, source="built-in")
    user: list[Path] = []
    for d in extra_dirs:
        d = Path(d)
        if not d.is_dir():
            raise BadInput(f"{d}: strategies directory not found")
        files = sorted(d.glob("*.toml"))
        if not files:  # most likely the wrong directory: say so rather than add nothing
            raise BadInput(f"{d}: no strategy files (*.toml) in this strategies directory")
        user.extend(files)
    user.extend(Path(f) for f in extra_files)
    read: set[Path] = set()  # one file named twice (as --strategy-file and in a --strategies-dir) is one strategy
    for p in user:
        if (where := p.resolve()) in read:
            continue
        read.add(where)
        s = load_strategy(p)
        if s.name in found:
            if found[s.name].source == "built-in":
                raise BadInput(f"{p}: {s.name!r} is a built-in strategy; the file's name names the strategy, "
                               f"so rename the file (my-{s.name}.toml)")
            raise BadInput(f"{p}: strategy {s.name!r} is already defined by {found[s.name].source}")
        found[s.name] = s
    return found


def select(catalogue: dict[str, Strategy], names: Iterable[str]) -> list[Strategy]:
    chosen = []
    for n in names:
        if n not in catalogue:
            raise unknown("strategy", n, catalogue)
        chosen.append(catalogue[n])
    return chosen
