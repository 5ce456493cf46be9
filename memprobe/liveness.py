"""What is live at the peak: the compiler's own buffer listing, named in the model's terms.

Source, by what exists (measured with jax 0.12, libtpu 0.0.50.1 and the CUDA 12 plugin):

- ``memory_analysis().serialized_buffer_assignment_proto`` is empty for deviceless TPU
  compiles, so it cannot be used there.
- Compiling with the ``xla_dump_to`` compiler option makes the TPU compiler, and the GPU
  compiler deviceless, write per module the optimized HLO (``*.after_optimizations.txt``), the buffer assignment
  (``*-buffer-assignment.txt``: every allocation with its size and memory space, and every
  value placed in it with its offset and size) and the live ranges (``*-live-range.txt``:
  the instruction sequence and every value's live interval). memprobe reads those three
  files; nothing else in them is relied on.

What memprobe computes from them, and why not the live-range file's own "(peak)" listing:
that listing sums every memory space together (on-chip VMEM and SMEM too), so its peak is
not the HBM peak; on tiny E2B ``scan-checkpoint`` a fifth of it was VMEM. memprobe keeps
the values of memory space 0 (HBM) and counts once the values that share an address while
both are live (an in-place update: the operand's range ends where the result's begins, in
the same bytes). That gives the bytes live in HBM at every point of the program; the peak
is its maximum. The compiler's HBM heap is its temp allocation in space 0, sized by where
it placed the values; memprobe checks its reading against it: the highest heap address in
use (``heap_top_bytes``) reaches exactly the allocation's size.

The buffer assignment also gives the allocations that are not in the heap: other HBM
allocations that are not arguments or outputs (constants: ``fixed_bytes``) and those of
the device's on-chip memory spaces (VMEM, SMEM: ``onchip_bytes``). On TPU,
``memory_analysis().temp_size_in_bytes`` exceeds the heap and the constants, but not always
the on-chip memory too (a small program can have more VMEM than that excess): the render
splits the peak by the HBM figures and names the on-chip memory apart (render/explain.py).
That excess is no buffer: libtpu's own log of the compile shows temp to be its heap plus
what it calls the heap's fragmentation (``parse_libtpu_heap``), which an explain compile
process for a TPU target keeps (compile.py).

Host memory (memory space 5, where offload puts bytes; the TPU dump's memory report calls
it ``cmem``, but its allocations add up to ``host_temp_size_in_bytes`` to the byte, 153.75
GiB for E4B ``offload-mlp``; not so for a scan of several trips, below) is swept like HBM,
apart from it: the most host bytes live at once and the buffers live there, those live at
the HBM peak, and the most HBM + host bytes live at one point. They size the host side of
an offload strategy, and they show what XLA's own ``peak_memory_in_bytes`` is not under
heavy offload (E4B ``offload-mlp``: neither the HBM live nor HBM + host). For
``scan-layers-offload`` libtpu's host temp exceeds every host allocation (full-size E2B at
8192 x 1: 1,258,291,200 B against 880,803,840, which is exactly the 35 layer inputs), so
the host allocations are kept too (``host_heap_bytes``).

A buffer is named after the HLO instruction that defines it. Its shape comes from the
optimized HLO; the JAX op name in the instruction's metadata says the rest: the model's
``layer<i>`` and tensor scopes (``mlp_hidden``, ``query_proj``, ...; see model/_modules.py),
whether it is forward (``jvp``) or backward (``transpose``) work, the step's own work
(the optimizer update, gradient accumulation: name scopes build.py opens), or an argument
path (``p[...]`` parameters, ``o[...]`` optimizer state). Instructions without metadata
(async copies, all-gathers) take it from their source: the first operand, or the tuple
element a ``get-tuple-element`` or a ``name#k`` operand picks. A value a while loop carries
has no metadata either, whether it is the body's parameter or the buffer the loop starts
from (an ``AllocateBuffer`` custom call, a copy, or such a buffer copied to on-chip memory
before the loop starts: 5.87 MiB, 1% of what is live at small-deep's ``scan-layers-offload``
peak on tpu7x at seq 2048 x 2, was "other" so): it takes the name of what the body passes
on in its place, else the loop's own. A value made inside a computation that a ``call`` or
an ``async-start`` runs (tpu7x's SparseCores run layout copies and collectives that way) takes
the name of what the caller passes for the parameter it comes from; an ``async-done`` or a
``call`` holds what its computation's root holds. Before memprobe followed loops, these were
18% of the bytes live at tiny E2B ``scan-checkpoint``'s peak (v5p, seq 1024 x 2) and 16.78
GiB of full-size E2B's at seq 24576 x 8; 11.06 GiB with loops followed, three SparseCore
copies, and none but 512-byte scalars with calls followed too.

A scan of several trips stacks what each trip outputs: a dynamic-update-slice writes the
trip's slice into a buffer the whole loop carries (for ``scan-layers-offload``'s layer
inputs an async one, with no op name, into host memory). Such a stack is named after the
slice written, not the buffer written into (which leads back to the stack itself), and
through the scan's own stacking ops (``jit(dynamic_update_index_in_dim)``), which say
nothing of the model. A loop's output k, read by index, is what its body passes on at k.
On full-size E2B ``scan-layers-offload`` at seq 24576 x 8 this named the 11.25 GiB of host
stacks that were "other custom-call" and the other stack's 8.44 GiB, which the loop
counter's ``add`` had named; in HBM, at the peak, 4.71 GiB of stacked gradients named after
that ``add`` (3.04 GiB) or the scan's stacking (1.67 GiB).
"""

from __future__ import annotations

import dataclasses
import heapq
import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from memprobe.errors import BadInput

if TYPE_CHECKING:
    from memprobe.measure import Measurement

# Tensor scopes the model opens (model/_modules.py), most specific first.
TENSOR_SCOPES = ("key_value_proj", "query_proj", "attention_out", "attention", "mlp_hidden", "mlp_out")
# Name scopes the step's own work runs in (build.py): the optimizer update, and gradient
# accumulation's loop over microbatches.
OPTIMIZER_SCOPE, ACCUM_SCOPE = "optimizer_update", "grad_accum"
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
    def layer_label(self) -> str:
        """Which layer the buffer is from: its number, or for a scan over stacked layers the
        stack's layers and the position in its period ("15-34, pos 4"); "-" when none."""
        if self.layer is not None:
            return str(self.layer)
        stack = re.search(r"\blayers(\d+)-(\d+)/position(\d+)\b", self.op_name)
        return f"{stack[1]}-{stack[2]}, pos {stack[3]}" if stack else "-"

    @property
    def label(self) -> str:
        """What the buffer is, in the model's terms, without its layer."""
        if self.kind in ("parameter", "optimizer state", "batch"):
            return re.sub(r"\['layers'\]\[\d+\]", "['layers'][*]", self.op_name)
        parts = [self.kind]
        if self.tensor:
            parts.append(self.tensor)
        op = self.op_name.rsplit("/", 1)[-1] if self.op_name else self.value.split("{")[0]
        parts.append(re.sub(r"\.\d.*$", "", op))  # "constant.2254.clone", "reshape.182": the opcode
        return " ".join(parts)


@dataclasses.dataclass
class Explanation:
    peak_time: int  # position in the instruction sequence where the most HBM is live
    program_length: int
    peak_live_bytes: int  # HBM bytes live at the peak: the buffers below
    heap_bytes: int  # the compiler's HBM heap: its temp allocation(s) in memory space 0
    heap_live_bytes: int  # of peak_live_bytes, the part inside the heap (the rest: arguments, outputs)
    heap_top_bytes: int  # the highest heap address any placed value reaches (== heap_bytes when read right)
    fixed_bytes: int  # HBM allocations outside the heap that are not arguments or outputs (constants)
    onchip_bytes: int  # allocations in the device's other memory spaces (VMEM, SMEM, ...)
    buffers: list[Buffer]  # live at the peak, largest first
    curve: list[tuple[int, int]]  # (program position, HBM bytes live), sampled
    # Host memory (memory space 5, where offload puts bytes), read the same way as HBM.
    # None in answers stored before memprobe read it (cache entries, saved JSON).
    host_peak_live_bytes: int | None = None  # the most host bytes live at any point
    host_peak_time: int | None = None  # the first point where that many are live
    host_live_bytes: int | None = None  # host bytes live at the HBM peak (peak_time)
    combined_peak_bytes: int | None = None  # the most HBM + host bytes live at one point
    # (position, host bytes live), sampled; empty without host bytes
    host_curve: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # The host buffers live at host_peak_time, largest first (the first offloaded first among
    # equals), named as the HBM ones; and the host allocations the buffer assignment makes
    # (not arguments or outputs), to set beside memory_analysis()'s host temp. None in
    # answers stored before memprobe read them.
    host_buffers: list[Buffer] | None = None
    host_heap_bytes: int | None = None
    # Whether buffers were named by the step's scopes and loop carries by what their body
    # passes on (EXPLAIN_FORMAT 7); False in answers stored before.
    names_loops: bool = False
    # libtpu's own account of the program's HBM heap, from its log of this compile
    # (``libtpu_heap``); None for other compilers, and in answers stored before.
    libtpu_heap: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["curve"] = [list(p) for p in self.curve]
        d["host_curve"] = [list(p) for p in self.host_curve]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Explanation:
        # Answers stored before op names were unescaped (cache entries, saved JSON) read
        # the same as fresh ones: an op name holds no backslash once unescaped, so unescaping
        # it again changes nothing.
        def buffers(listing):
            return [Buffer(**{**b, "op_name": unescape(b["op_name"])}) for b in listing]

        host = d.get("host_buffers")
        return cls(**{**d, "buffers": buffers(d["buffers"]), "curve": [tuple(p) for p in d["curve"]],
                      "host_curve": [tuple(p) for p in d.get("host_curve", ())],
                      "host_buffers": None if host is None else buffers(host)})


# --- libtpu's log: its own account of the HBM heap ------------------------------------

# After each compile libtpu logs (at info level, into the files under $TPU_LOG_DIR) what the
# program needs per memory space. Its HBM block has the heap's line, sizes as it rounds them:
#   Program hbm requirement 81.97G:
#       HLO temp         81.86G (100.0% utilization: Unpadded (57.56G) Padded (57.57G), 29.7% fragmentation (24.29G))
# memory_analysis()'s temp is that HLO temp plus that fragmentation, to the log's rounding, on
# every TPU program measured (libtpu 0.0.50.1: tiny E2B on v5e, v5p, v6e and tpu7x, full-size
# E2B scan-checkpoint at seq 24576 x 8 on tpu7x): the temp the buffer assignment places
# nowhere is the fragmentation, counted a second time. K, M, G are KiB, MiB, GiB (the
# heap's line matches the buffer assignment's heap in those units).
LIBTPU_LOG = "tpu_driver.INFO"  # the newest info log, linked by libtpu under $TPU_LOG_DIR
_HEAP_LINE = re.compile(r"^\s+HLO temp\s+([\d.]+)([KMG]?)B?\s.*?\bfragmentation \(([\d.]+)([KMG]?)B?\)")
_LOG_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_libtpu_heap(log: str) -> dict[str, Any] | None:
    """The HBM heap's size and fragmentation from the last HBM block of a libtpu info log:
    as printed ("81.86G") and in bytes (exact only to that rounding); None without one."""
    found = None
    in_hbm = False
    for line in log.splitlines():
        if "Program " in line and " requirement " in line:
            in_hbm = "Program hbm requirement" in line
        elif in_hbm and (m := _HEAP_LINE.match(line)):
            found, in_hbm = m.groups(), False
    if found is None:
        return None
    heap, heap_unit, frag, frag_unit = found
    return {"hlo_temp": heap + heap_unit, "fragmentation": frag + frag_unit,
            "hlo_temp_bytes": round(float(heap) * _LOG_UNITS[heap_unit]),
            "fragmentation_bytes": round(float(frag) * _LOG_UNITS[frag_unit]),
            # one unit of the last printed digit, each: how far their sum may be off
            "rounding_bytes": round(_last_digit(heap) * _LOG_UNITS[heap_unit]
                                    + _last_digit(frag) * _LOG_UNITS[frag_unit])}


def _last_digit(number: str) -> float:
    """What one unit of a printed number's last digit is worth: 0.01 for "81.86", 0.1 for
    "585.6" (libtpu prints K sizes so), 1 for "4"."""
    return 10.0 ** -len(number.partition(".")[2])


# --- the optimized HLO: instructions, and what while loops carry -----------------------

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')  # HLO text escapes quotes inside
_ESCAPED = re.compile(r"\\(['\"\\])")


def unescape(op_name: str) -> str:
    """An op name as JAX wrote it: HLO text prints ``p['ple_table']`` as ``p[\\'ple_table\\']``."""
    return _ESCAPED.sub(r"\1", op_name)
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


class Instr(NamedTuple):
    shape: str  # as printed, layouts and all
    op_name: str  # "" when the instruction has no op name
    opcode: str
    operands: tuple[str, ...]
    index: int | None  # a get-tuple-element's index


@dataclasses.dataclass
class Hlo:
    """The optimized HLO, as far as naming buffers needs it."""
    instrs: dict[str, Instr]
    loops: dict[str, tuple[str, ...]]  # a while -> its body's root operands (what each trip passes on)
    carries: dict[str, str]  # a while body's parameter -> the while
    # An operand of a while's initial tuple, (name, index: (k,) for "name#k"), -> (the while, its position).
    inits: dict[tuple[str, tuple[int, ...]], tuple[str, int]]
    # A parameter of a computation that a call, async-start or fusion runs -> the caller's
    # operand it stands for. (TPU runs layout copies on its SparseCores that way: a copy
    # nested two calls deep whose only source is the caller's operand.)
    passes: dict[str, str] = dataclasses.field(default_factory=dict)
    # A call, async-start or fusion -> the root of the computation it runs (what its result holds).
    returns: dict[str, str] = dataclasses.field(default_factory=dict)
    # A value -> the copy (copy, copy-start, copy-done) that moves it on, read forward from a
    # buffer allocated for a loop but copied into another memory space before the loop starts.
    moved: dict[str, str] = dataclasses.field(default_factory=dict)


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+) \(")
_CALLERS = ("call", "async-start", "fusion")  # those whose callee's parameter k is their operand k
_OPERAND = re.compile(r"%?([\w.\-]+(?:#\d+)?)\s*$")  # "name#k": element k of name's tuple


def _element_of(operand: str) -> tuple[str, tuple[int, ...]]:
    """An operand as (instruction, index): "fusion.9#1" is element (1,) of fusion.9."""
    name, _, element = operand.partition("#")
    return name, (int(element),) if element else ()


def parse_hlo(text: str) -> Hlo:
    """Every instruction of every computation (shape, op name, opcode, operands); per while
    loop its body's parameter, the tuple its body returns and the tuple it starts from; per
    call, async-start or fusion what its callee's parameters stand for and what it returns."""
    instrs, params, roots, bodies = {}, defaultdict(list), {}, {}
    numbered, calls = defaultdict(dict), {}  # computation -> {parameter number: name}; caller -> computation
    computation = ""
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            c = _COMPUTATION.match(line)
            computation = c.group(1) if c else computation
            continue
        name, rest = m.group(1), line[m.end():]
        end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
        shape = rest[:end] if end > 0 else rest
        after = rest[end:].lstrip()
        om = re.match(r"([\w\-]+)\(", after)
        opcode, operands = (om.group(1), after[om.end() - 1:_balanced(after, om.end() - 1)]) if om else ("", "()")
        names = tuple(o.group(1) for part in _split_top(operands[1:-1]) if (o := _OPERAND.search(part)))
        index = re.search(r"\bindex=(\d+)", after) if opcode == "get-tuple-element" else None
        op = _OP_NAME.search(line)
        instrs[name] = Instr(shape, unescape(op.group(1)) if op else "", opcode, names,
                             int(index.group(1)) if index else None)
        if opcode == "parameter":
            params[computation].append(name)
            if (number := re.match(r"parameter\((\d+)\)", after)):
                numbered[computation][int(number.group(1))] = name
        if opcode in _CALLERS and (callee := re.search(r"\b(?:to_apply|calls)=%?([\w.\-]+)", after)):
            calls[name] = callee.group(1)
        if line.lstrip().startswith("ROOT "):
            roots[computation] = name
        if opcode == "while" and (body := re.search(r"\bbody=%?([\w.\-]+)", after)):
            bodies[name] = body.group(1)
    loops, carries, inits = {}, {}, {}
    for loop, body in bodies.items():
        root = instrs.get(roots.get(body, ""))
        loops[loop] = root.operands if root and root.opcode == "tuple" else ()
        carries.update(dict.fromkeys(params.get(body, ()), loop))
        start = instrs.get(next(iter(instrs[loop].operands), ""))
        for k, operand in enumerate(start.operands if start and start.opcode == "tuple" else ()):
            inits.setdefault(_element_of(operand), (loop, k))
    # An async-start may take no operands itself (TPU's SparseCore calls): the async-update
    # after it passes them on, and they are the start's for naming.
    for update in [i for i in instrs.values() if i.opcode == "async-update" and len(i.operands) > 1]:
        begun = instrs.get(update.operands[0])
        if begun and begun.opcode == "async-start" and not begun.operands:
            instrs[update.operands[0]] = begun._replace(operands=update.operands[1:])
    passes, returns = {}, {}
    for caller, callee in calls.items():
        operands = instrs[caller].operands
        for k, param in numbered.get(callee, {}).items():
            if k < len(operands):
                passes.setdefault(param, operands[k])
        if callee in roots:
            returns[caller] = roots[callee]
    moved = {}
    for name, rec in instrs.items():
        if rec.opcode in ("copy", "copy-start", "copy-done") and rec.operands:
            moved.setdefault(rec.operands[0], name)
    return Hlo(instrs, loops, carries, inits, passes, returns, moved)


def _element(shape: str, index: list[int]) -> str:
    for i in index:
        if not shape.startswith("("):
            break
        parts = _split_top(shape[1:_balanced(shape, 0) - 1])
        shape = parts[i] if i < len(parts) else ""
    return _clean(shape)


# --- live ranges and buffer sizes --------------------------------------------------------

_VALUE = re.compile(r"^([\w.\-]+)\{([\d,]*)\}$")
_RANGE = re.compile(r"^\s+([\w.\-]+\{[\d,]*\}):(\d+)-(\d+)$")
_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+),(?: color (\d+),)?")
_PLACED = re.compile(r"^ value: <\d+ ([\w.\-]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)")


def parse_live_range(text: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """(program length, value -> live interval, both ends inclusive)."""
    length, ranges, in_ranges = 0, {}, False
    for line in text.splitlines():
        if line.startswith("HloLiveRange (max"):
            length = int(re.search(r"max (\d+)", line).group(1))
        elif line.strip() == "BufferLiveRange:":
            in_ranges = True
        elif in_ranges:
            r = _RANGE.match(line)
            if r:
                ranges[r.group(1)] = (int(r.group(2)), int(r.group(3)))
            elif line.strip():
                in_ranges = False  # the next section ("Live ranges at ...")
    return length, ranges


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where the buffer assignment placed a value."""
    allocation: int
    offset: int
    size: int
    in_heap: bool  # in the HBM temp heap, not an argument, output or constant allocation


HOST_SPACE = 5  # XLA's memory space for host memory (pinned_host offload), as in S(5) layouts


@dataclasses.dataclass
class Assignment:
    slots: dict[str, Slot]  # HBM value -> where it is placed
    heap_bytes: int  # the HBM temp heap: memory space 0's preallocated-temp allocation(s)
    fixed_bytes: int  # other HBM allocations that are neither arguments nor outputs (constants, ...)
    onchip_bytes: int  # allocations in the other device memory spaces (VMEM, SMEM, ...)
    host_slots: dict[str, Slot] = dataclasses.field(default_factory=dict)  # host memory value -> place
    host_heap_bytes: int = 0  # host memory (space 5) allocations that are neither arguments nor outputs


def parse_assignment(text: str) -> Assignment:
    """What the buffer assignment places, and where. Values are kept for memory space 0 (HBM)
    and, apart, for host memory (space 5); VMEM and SMEM are other spaces ("color N" in the
    allocation's line), counted by allocation only."""
    out = Assignment({}, 0, 0, 0)
    index, color, in_heap = -1, 0, False
    for line in text.splitlines():
        a = _ALLOCATION.match(line)
        if a:
            index, size, color = int(a.group(1)), int(a.group(2)), int(a.group(3) or 0)
            kind = line[a.end():]
            in_heap = "preallocated-temp" in kind
            argument_or_output = "parameter" in kind or "output" in kind or "live-out" in kind
            if color == 0 and in_heap:
                out.heap_bytes += size
            elif color == 0 and not argument_or_output:
                out.fixed_bytes += size
            elif color == HOST_SPACE and not argument_or_output:
                out.host_heap_bytes += size
            elif color not in (0, HOST_SPACE) and not argument_or_output:
                out.onchip_bytes += size
            continue
        if color in (0, HOST_SPACE):
            v = _PLACED.match(line)
            if v:
                slots = out.slots if color == 0 else out.host_slots
                slots[v.group(1) + (v.group(2) or "{}")] = Slot(index, int(v.group(4)), int(v.group(3)), in_heap)
    return out


@dataclasses.dataclass
class Sweep:
    live: list[int]  # HBM bytes live at each program position
    heap_top: int  # the highest heap address reached
    peak_time: int  # the first position where ``live`` is largest
    peak_values: list[str]  # one value per occupied address at the peak


def sweep(ranges: dict[str, tuple[int, int]], slots: dict[str, Slot], length: int) -> Sweep:
    """Walks the program once: at each position, adds the values that start there, measures,
    then drops the values that end there. Values live at one address at once (an in-place
    update) count once, at the largest size."""
    starts, ends = defaultdict(list), defaultdict(list)
    for value, (start, end) in ranges.items():
        slot = slots.get(value)
        if slot is not None and slot.size:
            starts[start].append(value)
            ends[min(end, length)].append(value)
    at: dict[tuple[int, int], list[str]] = {}  # address -> values live there
    counted: dict[tuple[int, int], int] = {}  # address -> the bytes counted for it
    tops: list[tuple[int, str]] = []  # heap ends of live values, negated; stale entries skipped
    alive: set[str] = set()
    total = heap_top = 0
    live = []

    def recount(key: tuple[int, int]) -> int:
        size = max((slots[v].size for v in at[key]), default=0)
        change = size - counted.get(key, 0)
        counted[key] = size
        return change

    for t in range(length + 1):
        for value in starts.get(t, ()):
            s = slots[value]
            key = (s.allocation, s.offset)
            at.setdefault(key, []).append(value)
            total += recount(key)
            alive.add(value)
            if s.in_heap:
                heapq.heappush(tops, (-(s.offset + s.size), value))
        while tops and tops[0][1] not in alive:
            heapq.heappop(tops)
        heap_top = max(heap_top, -tops[0][0] if tops else 0)
        live.append(total)
        for value in ends.get(t, ()):
            s = slots[value]
            key = (s.allocation, s.offset)
            at[key].remove(value)
            total += recount(key)
            if not at[key]:
                del at[key], counted[key]
            alive.discard(value)
    peak_time = live.index(max(live)) if live else 0
    # Each address's occupant at the peak: its largest value, the newest of equals.
    occupants: dict[tuple[int, int], str] = {}
    for values in starts.values():
        for value in values:
            start, end = ranges[value]
            if not start <= peak_time <= end:
                continue
            key = (slots[value].allocation, slots[value].offset)
            rival = occupants.get(key)
            if rival is None or (slots[value].size, start) > (slots[rival].size, ranges[rival][0]):
                occupants[key] = value
    return Sweep(live, heap_top, peak_time, list(occupants.values()))


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
    if re.search(rf"\b{OPTIMIZER_SCOPE}\b", op_name):
        return "optimizer update"
    if re.search(rf"\b{ACCUM_SCOPE}\b", op_name):
        return "gradient accumulation"
    return "other"


# An op name the compiler made from an instruction's name ("reshape.182", "broadcast.1063")
# rather than one JAX wrote: it says nothing of the model, so the source is followed on.
_XLA_MADE = re.compile(r"[\w\-]+(?:\.\d+)+")
# How a scan stacks what each trip outputs (lax.dynamic_update_index_in_dim: a leading axis
# added, then the slice written in): the scan's, not the model's, so the value stacked is
# followed instead.
_STACKING = re.compile(r".*/jit\(dynamic_update_index_in_dim\)/(?:broadcast_in_dim|dynamic_update_slice)")


def _source(hlo: Hlo, instr: str | None, index: list[int], seen: set) -> str:
    """The JAX op name that says what (``instr``, ``index``) holds: its own, else its source's
    (copies, gathers, tuple elements). A value a while loop carries, as the body's parameter
    or as what the loop starts from (a buffer allocated for the loop to fill has no other
    source), is named after what the body passes on in its place, else after the loop; so is
    the loop's own output at that index. A called computation's parameter is what its caller
    passes; a call's result, its root's. A stack that a dynamic-update-slice fills is what is
    written into it (what the loop writes there, when a loop goes on filling it)."""
    loop_start = None
    while instr is not None and (instr, tuple(index)) not in seen:
        seen.add((instr, tuple(index)))
        if "#" in instr:
            instr, element = _element_of(instr)
            index = [*element, *index]
            continue
        rec = hlo.instrs.get(instr)
        if rec is None:
            break
        stacking = bool(_STACKING.fullmatch(rec.op_name))
        if rec.op_name and not stacking and not _XLA_MADE.fullmatch(rec.op_name):
            return rec.op_name
        if stacking and rec.opcode == "fusion" and instr in hlo.returns:
            instr = hlo.returns[instr]  # the stacking inside: its update is one of the fusion's operands
            continue
        if rec.opcode == "get-tuple-element" and rec.operands:
            instr, index = rec.operands[0], [rec.index, *index]
            continue
        if instr in hlo.carries and index:
            return _carried(hlo, hlo.carries[instr], index[0], index[1:], seen)
        if rec.opcode == "while" and index:  # what the loop ends with: what its body passes on
            return _carried(hlo, instr, index[0], index[1:], seen)
        if rec.opcode == "tuple" and index and index[0] < len(rec.operands):
            instr, index = rec.operands[index[0]], index[1:]
            continue
        if loop_start is None and (instr, tuple(index)) in hlo.inits:
            loop_start = (*hlo.inits[(instr, tuple(index))], [])
        if loop_start is None and rec.opcode == "custom-call" and not rec.operands:
            loop_start = _filled_by(hlo, instr)
        if instr in hlo.passes:  # a called computation's parameter: what its caller passes
            instr = hlo.passes[instr]
            continue
        if rec.opcode == "async-done":  # the result of what its async-start runs
            begun = _async_start(hlo, instr)
            if begun in hlo.returns:
                instr = hlo.returns[begun]
                continue
        if rec.opcode == "call" and instr in hlo.returns:
            instr = hlo.returns[instr]
            continue
        if rec.opcode == "dynamic-update-slice" and len(rec.operands) > 1:
            # A stack being filled. When a loop goes on filling it, it is what the loop writes
            # (XLA may write the first trip's slice before the loop); else what is written here.
            stacked = _carried(hlo, *loop_start, seen) if loop_start else ""
            if stacked:
                return stacked
            instr, index = rec.operands[1], []
            continue
        instr, index = (rec.operands[0] if rec.operands else None), []  # copies, gathers: their source
    return _carried(hlo, *loop_start, seen) if loop_start else ""


def _filled_by(hlo: Hlo, allocated: str):
    """(loop, position, []) when a buffer allocated with no source (TPU's AllocateBuffer) is
    copied on, unchanged, into a loop's initial tuple; else None."""
    instr, hops = allocated, 0
    while instr in hlo.moved and hops < 8:
        instr, hops = hlo.moved[instr], hops + 1
        if (instr, ()) in hlo.inits:
            return (*hlo.inits[(instr, ())], [])
    return None


def _async_start(hlo: Hlo, done: str) -> str | None:
    """The async-start an async-done ends, through any async-updates between."""
    instr = done
    while (rec := hlo.instrs.get(instr)) and rec.opcode in ("async-done", "async-update") and rec.operands:
        instr = rec.operands[0]
    return instr if rec and rec.opcode == "async-start" else None


def _carried(hlo: Hlo, loop: str, k: int, index: list[int], seen: set) -> str:
    passed = hlo.loops.get(loop, ())
    return (_source(hlo, passed[k], index, seen) if k < len(passed) else "") or hlo.instrs[loop].op_name


def name_buffer(value: str, size: int, hlo: Hlo) -> Buffer:
    m = _VALUE.match(value)
    instr, index = (m.group(1), [int(i) for i in m.group(2).split(",") if i]) if m else (value, [])
    rec = hlo.instrs.get(instr)
    shape = _element(rec.shape, index) if rec and rec.shape else ""
    op_name = _source(hlo, instr, index, set())
    layer = re.search(r"\blayer(\d+)\b", op_name)
    tensor = next((t for t in TENSOR_SCOPES if re.search(rf"\b{t}\b", op_name)), None)
    return Buffer(value=value, bytes=size, shape=shape, op_name=op_name, kind=_kind(op_name),
                  layer=int(layer.group(1)) if layer else None, tensor=tensor)


def _sample(live: list[int]) -> list[tuple[int, int]]:
    step = max(1, len(live) // CURVE_POINTS)
    # Keep each window's maximum so no spike is sampled away.
    return [(t, max(live[t:t + step])) for t in range(0, len(live), step)]


def explain_dump(dump_dir: Path) -> Explanation:
    """Reads the entry module's dump files from ``dump_dir`` (one ``jit_train_step`` module)."""
    dump_dir = Path(dump_dir)

    def one(pattern: str) -> str:
        files = sorted(dump_dir.glob(f"*jit_*{pattern}"), key=lambda p: p.stat().st_size)
        if not files:
            raise ExplainUnavailable(f"the compiler wrote no {pattern} for this target")
        return files[-1].read_text(errors="replace")

    length, ranges = parse_live_range(one("after_optimizations-live-range.txt"))
    placed = parse_assignment(one("after_optimizations-buffer-assignment.txt"))
    slots = placed.slots
    hlo = parse_hlo(one("after_optimizations.txt"))
    walk = sweep(ranges, slots, length)
    host_walk = sweep(ranges, placed.host_slots, length)
    host = host_walk.live  # one entry per position, as walk.live
    buffers = sorted((name_buffer(v, slots[v].size, hlo) for v in walk.peak_values), key=lambda b: -b.bytes)
    host_buffers = [name_buffer(v, placed.host_slots[v].size, hlo)
                    for v in sorted(host_walk.peak_values, key=lambda v: (-placed.host_slots[v].size, ranges[v][0]))]
    host_peak = max(host)
    return Explanation(peak_time=walk.peak_time, program_length=length,
                       peak_live_bytes=sum(b.bytes for b in buffers), heap_bytes=placed.heap_bytes,
                       heap_live_bytes=sum(slots[v].size for v in walk.peak_values if slots[v].in_heap),
                       heap_top_bytes=walk.heap_top, fixed_bytes=placed.fixed_bytes,
                       onchip_bytes=placed.onchip_bytes, buffers=buffers, curve=_sample(walk.live),
                       host_peak_live_bytes=host_peak, host_peak_time=host.index(host_peak),
                       host_live_bytes=host[walk.peak_time],
                       combined_peak_bytes=max(map(sum, zip(walk.live, host, strict=True))),
                       host_curve=_sample(host) if host_peak else [],
                       host_buffers=host_buffers, host_heap_bytes=placed.host_heap_bytes, names_loops=True)


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


#: The ``schema`` of a saved ``Explained`` (`memprobe explain --format json`).
EXPLAIN_SCHEMA = "memprobe.explain"


@dataclasses.dataclass(frozen=True)
class Explained:
    """What ``memprobe explain`` answers: per strategy asked, in the order asked, its compile's
    measurement and what was live at its peak; the explanation is None where the compile
    failed (the measurement's ``error`` says why) or the TPU compiler refused the program
    (the measurement's ``oom_allocations`` list its report), and the others are kept."""

    answers: list[tuple[Measurement, Explanation | None]]
    command: str | None = None  # the command line, for report footers (the CLI sets it)

    @property
    def ok(self) -> bool:
        return all(e is not None for _, e in self.answers)

    @property
    def explained(self) -> list[tuple[Measurement, Explanation]]:
        """The answers whose compile worked."""
        return [(m, e) for m, e in self.answers if e is not None]

    @property
    def failed(self) -> list[Measurement]:
        """The strategies whose compile failed (not those the compiler refused over HBM)."""
        return [m for m, e in self.answers if e is None and not m.refused]

    @property
    def diff(self) -> list[dict[str, Any]] | None:
        """``diff(first, second)`` where two strategies were asked and both explained, else None."""
        if len(self.answers) != 2 or not self.ok:
            return None
        return diff(self.answers[0][1], self.answers[1][1])

    def save(self, path: str | Path) -> None:
        """Writes the JSON `memprobe explain --format json` writes: what ``memprobe.load`` and
        `memprobe report` read back."""
        from memprobe.render.explain import to_json  # pandas, as for any explain rendering
        from memprobe.result import save_json

        save_json(path, to_json(self), "ex", ("table", "markdown"))

    def explanation(self, strategy: str) -> Explanation:
        """The explanation of ``strategy``; KeyError when it was not asked or failed."""
        for m, e in self.answers:
            if m.strategy == strategy and e is not None:
                return e
        raise KeyError(strategy)
