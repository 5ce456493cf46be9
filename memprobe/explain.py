"""What is live at the peak: the compiler's own buffer listing, named in the model's terms.

Source, by what exists (measured with jax 0.12 / libtpu 0.0.50.1):

- ``memory_analysis().serialized_buffer_assignment_proto`` is empty for deviceless TPU
  compiles, so it cannot be used there.
- Compiling with the ``xla_dump_to`` compiler option makes the TPU compiler write, per
  module, the optimized HLO (``*.after_optimizations.txt``), the buffer assignment
  (``*-buffer-assignment.txt``: every value's size) and the live ranges
  (``*-live-range.txt``: the instruction sequence, every value's live interval, and
  "Live ranges at T (peak)": the values live at the heap peak, with sizes). memprobe
  reads those three files; nothing else in them is relied on.

A buffer is named after the HLO instruction that defines it. Its shape comes from the
optimized HLO; the JAX op name in the instruction's metadata says the rest: the model's
``layer<i>`` and tensor scopes (``mlp_hidden``, ``query_proj``, ...; see model/_modules.py),
whether it is forward (``jvp``) or backward (``transpose``) work, or an argument path
(``p[...]`` parameters, ``o[...]`` optimizer state). Instructions without metadata (async
copies, all-gathers) take it from their first operand.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from memprobe.errors import BadInput

# Tensor scopes the model opens (model/_modules.py), most specific first.
TENSOR_SCOPES = ("key_value_proj", "query_proj", "attention_out", "attention", "mlp_hidden", "mlp_out")
CURVE_POINTS = 400


class ExplainUnavailable(BadInput):
    """The compiler left no buffer listing for this target (exit code 2, like a bad target)."""


@dataclasses.dataclass(frozen=True)
class Buffer:
    value: str  # the HLO value, e.g. "fusion.469{1}"
    bytes: int
    shape: str  # e.g. "bf16[8,24576,12288]"; "" when unknown
    op_name: str  # JAX op name of the defining instruction ("" when none)
    kind: str  # parameter, optimizer state, batch, forward, backward, other
    layer: int | None
    tensor: str | None  # the model's tensor scope, e.g. "mlp_hidden"

    @property
    def label(self) -> str:
        """What the buffer is, in the model's terms, without its layer."""
        if self.kind in ("parameter", "optimizer state", "batch"):
            return re.sub(r"\['layers'\]\[\d+\]", "['layers'][*]", self.op_name)
        parts = [self.kind]
        if self.tensor:
            parts.append(self.tensor)
        op = self.op_name.rsplit("/", 1)[-1] if self.op_name else self.value.split("{")[0].rstrip("0123456789.")
        parts.append(op)
        return " ".join(parts)


@dataclasses.dataclass
class Explanation:
    peak_time: int  # position in the instruction sequence
    program_length: int
    peak_live_bytes: int  # the values live at the peak, as the live-range listing sums them
    buffers: list[Buffer]  # live at the peak, largest first
    curve: list[tuple[int, int]]  # (program position, bytes live), sampled

    def to_dict(self) -> dict[str, Any]:
        return {"peak_time": self.peak_time, "program_length": self.program_length,
                "peak_live_bytes": self.peak_live_bytes,
                "buffers": [dataclasses.asdict(b) for b in self.buffers],
                "curve": [list(p) for p in self.curve]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Explanation:
        return cls(d["peak_time"], d["program_length"], d["peak_live_bytes"],
                   [Buffer(**b) for b in d["buffers"]], [tuple(p) for p in d["curve"]])


# --- the optimized HLO: instruction -> shape, op name, first operand --------------------

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_LAYOUT = re.compile(r"\{[^{}]*\}")


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _split_top(text: str) -> list[str]:
    """Top-level comma-separated parts of a tuple shape's inside."""
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if cur:
        parts.append("".join(cur))
    return [re.sub(r"/\*.*?\*/", "", p).strip() for p in parts]


def _clean(shape: str) -> str:
    prev = None
    while prev != shape:  # layouts hold nested braces: strip innermost first
        prev, shape = shape, _LAYOUT.sub("", shape)
    return shape.strip()


def parse_hlo(text: str) -> dict[str, tuple[str, str, str | None]]:
    """Instruction name -> (shape with layouts removed, op name, first operand name)."""
    out = {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        rest = line[m.end():]
        end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
        shape = rest[:end] if end > 0 else rest
        after = rest[end:].lstrip()
        paren = after.find("(")
        operand = None
        if paren >= 0:
            om = re.match(r"\s*%?([\w.\-]+)", after[paren + 1:])
            operand = om.group(1) if om else None
        op = _OP_NAME.search(line)
        out[m.group(1)] = (shape, op.group(1) if op else "", operand)
    return out


def _element(shape: str, index: list[int]) -> str:
    for i in index:
        if not shape.startswith("("):
            break
        parts = _split_top(shape[1:_balanced(shape, 0) - 1])
        shape = parts[i] if i < len(parts) else ""
    return _clean(shape)


# --- live ranges and buffer sizes --------------------------------------------------------

_VALUE = re.compile(r"^([\w.\-]+)\{([\d,]*)\}$")
_PEAK = re.compile(r"^\s*Live ranges at (\d+) \(peak\):")
_PEAK_ROW = re.compile(r"^\s+([\w.\-]+\{[\d,]*\}): (\d+) bytes")
_RANGE = re.compile(r"^\s+([\w.\-]+\{[\d,]*\}):(\d+)-(\d+)$")
_SIZE = re.compile(r"value: <\d+ ([\w.\-]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),")


def parse_live_range(text: str) -> tuple[int, int, list[tuple[str, int]], dict[str, tuple[int, int]]]:
    """(peak position, program length, [(value, bytes) live at the peak], value -> interval)."""
    length = peak = 0
    live, ranges = [], {}
    section = None
    for line in text.splitlines():
        if line.startswith("HloLiveRange (max"):
            length = int(re.search(r"max (\d+)", line).group(1))
            continue
        stripped = line.strip()
        if stripped == "BufferLiveRange:":
            section = "ranges"
            continue
        m = _PEAK.match(line)
        if m:
            peak, section = int(m.group(1)), "peak"
            continue
        if stripped.startswith("Stack trace breakdown") or stripped == "InstructionSequence:":
            section = None
            continue
        if section == "ranges":
            r = _RANGE.match(line)
            if r:
                ranges[r.group(1)] = (int(r.group(2)), int(r.group(3)))
        elif section == "peak":
            r = _PEAK_ROW.match(line)
            if r:
                live.append((r.group(1), int(r.group(2))))
    return peak, length, live, ranges


def parse_sizes(text: str) -> dict[str, int]:
    """Value -> bytes, from the buffer assignment listing (device memory values only)."""
    return {m.group(1) + (m.group(2) or "{}"): int(m.group(3)) for m in _SIZE.finditer(text)}


# --- naming ---------------------------------------------------------------------------

def _kind(op_name: str) -> str:
    if op_name.startswith("p["):
        return "parameter"
    if op_name.startswith("o["):
        return "optimizer state"
    if op_name.startswith(("tokens", "targets")):
        return "batch"
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "other"


def name_buffer(value: str, size: int, hlo: dict[str, tuple[str, str, str | None]]) -> Buffer:
    m = _VALUE.match(value)
    instr, index = (m.group(1), [int(i) for i in m.group(2).split(",") if i]) if m else (value, [])
    shape, op_name, operand = hlo.get(instr, ("", "", None))
    shape = _element(shape, index) if shape else ""
    seen = {instr}
    while not op_name and operand and operand not in seen:  # copies, gathers: their source
        seen.add(operand)
        _, op_name, operand = hlo.get(operand, ("", "", None))
    layer = re.search(r"\blayer(\d+)\b", op_name)
    tensor = next((t for t in TENSOR_SCOPES if re.search(rf"\b{t}\b", op_name)), None)
    return Buffer(value=value, bytes=size, shape=shape, op_name=op_name, kind=_kind(op_name),
                  layer=int(layer.group(1)) if layer else None, tensor=tensor)


def _curve(ranges: dict[str, tuple[int, int]], sizes: dict[str, int], length: int) -> list[tuple[int, int]]:
    delta = [0] * (length + 2)
    for value, (start, end) in ranges.items():
        size = sizes.get(value)
        if size:
            delta[start] += size
            delta[min(end, length) + 1] -= size
    live, heap = 0, []
    for t in range(length + 1):
        live += delta[t]
        heap.append(live)
    step = max(1, len(heap) // CURVE_POINTS)
    # Keep each window's maximum so no spike is sampled away.
    return [(t, max(heap[t:t + step])) for t in range(0, len(heap), step)]


def explain_dump(dump_dir: Path) -> Explanation:
    """Reads the entry module's dump files from ``dump_dir`` (one ``jit_train_step`` module)."""
    dump_dir = Path(dump_dir)

    def one(pattern: str) -> str:
        files = sorted(dump_dir.glob(f"*jit_*{pattern}"), key=lambda p: p.stat().st_size)
        if not files:
            raise ExplainUnavailable(f"the compiler wrote no {pattern} for this target")
        return files[-1].read_text(errors="replace")

    peak, length, live, ranges = parse_live_range(one("after_optimizations-live-range.txt"))
    hlo = parse_hlo(one("after_optimizations.txt"))
    # The live-range listing's sizes where it has them, so the curve meets the peak listing.
    sizes = parse_sizes(one("after_optimizations-buffer-assignment.txt")) | dict(live)
    buffers = sorted((name_buffer(v, b, hlo) for v, b in live), key=lambda b: -b.bytes)
    return Explanation(peak_time=peak, program_length=length, peak_live_bytes=sum(b for _, b in live),
                       buffers=buffers, curve=_curve(ranges, sizes, length))


def diff(a: Explanation, b: Explanation) -> list[dict[str, Any]]:
    """Groups of buffers (same label and shape) whose bytes at the peak differ between ``a``
    and ``b``, largest difference first: what accounts for the gap between two peaks."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for which, exp in ((0, a), (1, b)):
        for buf in exp.buffers:
            g = groups[(buf.label, buf.shape)]
            g[which] += buf.bytes
            g[2 + which] += 1
    rows = [{"label": label, "shape": shape, "a_bytes": g[0], "b_bytes": g[1], "a_count": g[2],
             "b_count": g[3], "delta_bytes": g[1] - g[0]}
            for (label, shape), g in groups.items() if g[0] != g[1]]
    return sorted(rows, key=lambda r: -abs(r["delta_bytes"]))
