"""The measurement record: all that renderers and the gate ever see.

Every byte figure is the compiler's estimate from ``Compiled.memory_analysis()``, per
device. ``peak_bytes`` is the figure memprobe ranks by:

    peak_bytes = argument + output - alias + temp

which is what the TPU compiler checks against HBM when it decides whether a program
fits (its out-of-memory message quotes this total). XLA's own ``peak_memory_in_bytes``
is kept beside it as ``xla_peak_bytes``: on TPU it can be several GiB lower, and on the
CPU backend it counts only arguments and outputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import TYPE_CHECKING, Any

from memprobe.errors import BadInput

if TYPE_CHECKING:
    from memprobe.targets import Target

GIB = 1024**3


def in_gib(*sizes: int) -> list[str]:
    """Byte counts said together, as "1.25 GiB"; in bytes ("41,703,424 bytes") where two
    different ones would read the same to two decimals of GiB, or one that is not zero would
    read 0.00, so that a comparison never reads "0.04 GiB > 0.04 GiB"."""
    gib = [f"{n / GIB:.2f}" for n in sizes]
    same = any(a == b and m != n for (a, m), (b, n) in itertools.combinations(zip(gib, sizes), 2))
    if same or any(g == "0.00" and n for g, n in zip(gib, sizes)):
        return [f"{n:,} byte" if n == 1 else f"{n:,} bytes" for n in sizes]
    return [f"{g} GiB" for g in gib]


# How a refused row's error begins (compile.compiler_oom writes it) when the TPU compiler ran
# out of HBM and refused the program outright rather than reporting its peak; the flag that
# gives the reason leaves it out, its kind saying as much.
OVER_HBM = "over HBM: "


OOM_ALLOCATIONS_KEPT = 20  # the largest allocations of a refusal's report that its record keeps


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One line of the TPU compiler's out-of-memory report: a block of HBM and the HLO values
    it holds over the program. There is no buffer assignment to read for a program the
    compiler refuses; this is what it says instead."""

    size: str  # as the compiler rounds it: "5.72 GiB", "915.55 MiB"
    values: int  # how many HLO values share the block over the program
    shapes: str  # theirs, as the compiler lists them: "2×f32[512,3000000]"
    heap: bool  # inside the program's temp heap; else a block of its own, as each argument gets


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    model: str
    # A model file's sizes (``model_mapping``), so the record says what was compiled and
    # `memprobe check` can compile it again without the file; None for a preset.
    model_config: dict[str, Any] | None = None
    strategy: str
    strategy_knobs: dict[str, Any]
    target: str
    platform: str
    num_devices: int
    topology: str | None
    seq_len: int
    batch_per_device: int
    loss_chunks: int
    step: str
    optimizer: str | None = "adamw"  # None for a grad step, which compiles no update
    param_dtype: str = "fp32"
    grad_accum: int = 1  # microbatches of batch_per_device whose gradients one step sums
    # "ok"; "refused": the TPU compiler ran out of HBM and refused the program, so there is no
    # breakdown, only the total it needed (``needed_bytes``) and why (``error``); "failed".
    status: str = "ok"
    error: str | None = None
    needed_bytes: int | None = None  # a refused row's: what the compiler's out-of-memory report totals
    # A refused row's: the largest allocations of that report, largest first (at most
    # OOM_ALLOCATIONS_KEPT). None for other rows, and in refusals stored before memprobe kept them.
    oom_allocations: list[Allocation] | None = None
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    generated_code_bytes: int = 0
    host_argument_bytes: int = 0
    host_output_bytes: int = 0
    host_alias_bytes: int = 0
    host_temp_bytes: int = 0
    host_generated_code_bytes: int = 0
    xla_peak_bytes: int | None = None
    capacity_bytes: int | None = None
    # Set at report time from --host-ram, never by a compile: the RAM of one host, and how
    # many of the slice's devices share it. Both None when no host RAM was given.
    host_ram_bytes: int | None = None
    devices_per_host: int | None = None
    flops: float | None = None  # XLA's cost_analysis(): every while-loop body counted once
    matmul_flops: int | None = None  # of the traced step, loops and recompute counted (flops.py)
    lower_seconds: float | None = None  # tracing and lowering to HLO
    compile_seconds: float | None = None  # XLA's compile alone
    process_seconds: float | None = None  # the whole compile process: start-up, trace, lower, compile
    host_rss_bytes: int | None = None  # peak resident host memory of the compile process
    parameter_count: int | None = None
    while_loops: int | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    cached: bool = False  # answered from the results cache, not compiled in this run

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def refused(self) -> bool:
        """The TPU compiler refused the program over HBM: an answer (it does not fit), with
        no figures but the bytes it needed."""
        return self.status == "refused"

    @property
    def answered(self) -> bool:
        """The compiler gave a peak: its figures (ok) or its total on refusing (refused). A
        failed row has none."""
        return self.ok or self.refused

    @property
    def peak_bytes(self) -> int:
        """Per-device peak HBM (compiler estimate): argument + output - alias + temp; for a
        refused row the compiler's own total of that sum, whose parts it did not give."""
        if self.refused and self.needed_bytes is not None:
            return self.needed_bytes
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def host_bytes(self) -> int:
        """Host (pinned) memory the program holds: offloaded residuals and the like."""
        return (self.host_argument_bytes + self.host_output_bytes - self.host_alias_bytes
                + self.host_temp_bytes)

    @property
    def fits(self) -> bool | None:
        if self.refused:
            return False
        if not self.ok or self.capacity_bytes is None:
            return None
        return self.peak_bytes <= self.capacity_bytes

    @property
    def fits_host(self) -> bool | None:
        """Whether the host bytes of every device on one host fit in its RAM; None when no
        host RAM was given (or the row failed)."""
        if not self.ok or self.host_ram_bytes is None or self.devices_per_host is None:
            return None
        return self.host_bytes * self.devices_per_host <= self.host_ram_bytes

    @property
    def stands_for_accelerator(self) -> bool:
        return self.platform != "cpu"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["model_config"] is None:  # a preset: its name says it all, as before model files
            del d["model_config"]
        d["peak_bytes"] = self.peak_bytes if self.answered else None
        d["host_bytes"] = self.host_bytes if self.ok else None
        d["fits"] = self.fits
        d["fits_host"] = self.fits_host
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in d.items() if k in names}
        if fields.get("oom_allocations") is not None:
            fields["oom_allocations"] = [Allocation(**a) for a in fields["oom_allocations"]]
        return cls(**fields)


def host_sharing(platform: str, target: str, num_devices: int, topology: str | None,
                 devices_per_host: int | None = None) -> int | None:
    """How many devices of this slice share one host's RAM: ``devices_per_host`` when given
    (checked against the slice), else the target's default (``targets.devices_per_host``);
    None for a target without host memory (CPU)."""
    from memprobe.targets import devices_per_host as default_per_host

    per_host = default_per_host(platform, target, num_devices, topology)
    if per_host is None or devices_per_host is None:
        return per_host
    if devices_per_host > num_devices:
        raise BadInput(f"--devices-per-host {devices_per_host} is more than the {num_devices} "
                       f"devices of {topology or target}")
    return devices_per_host


def with_host_ram(measurements: list[Measurement], host_ram_bytes: int,
                  devices_per_host: int | None = None) -> list[Measurement]:
    """The measurements judged against one host's RAM, ``host_ram_bytes``, shared by
    ``devices_per_host`` devices (see ``host_sharing``). Rows on a target without host
    memory (CPU) are left as they are; if every row is, that is an error."""
    out = []
    for m in measurements:
        per_host = host_sharing(m.platform, m.target, m.num_devices, m.topology, devices_per_host)
        out.append(m if per_host is None else
                   dataclasses.replace(m, host_ram_bytes=host_ram_bytes, devices_per_host=per_host))
    if all(m.devices_per_host is None for m in out):
        raise BadInput("--host-ram: no row is for a target with host memory (the cpu backend has none)")
    return out


def host_ram_check(t: Target, host_ram: str | int | None,
                   devices_per_host: int | None) -> tuple[int, int] | None:
    """--host-ram and --devices-per-host for target ``t``, refused before any compile:
    (host RAM in bytes, devices sharing it), or None when no host RAM was given."""
    ram = parse_host_ram(host_ram, devices_per_host)
    if ram is None:
        return None
    per_host = host_sharing(t.platform, t.name, t.num_devices, t.topology, devices_per_host)
    if per_host is None:
        raise BadInput(f"--host-ram: target {t.name} has no host memory space to check")
    return ram, per_host


def parse_host_ram(host_ram: str | int | None, devices_per_host: int | None) -> int | None:
    """--host-ram in bytes (None when not given), with --devices-per-host checked beside it."""
    if devices_per_host is not None:
        if host_ram is None:
            raise BadInput("--devices-per-host only applies with --host-ram")
        if devices_per_host < 1:
            raise BadInput(f"--devices-per-host must be a positive integer, got {devices_per_host}")
    if host_ram is None:
        return None
    if isinstance(host_ram, str):
        return parse_positive_size(host_ram, "--host-ram")
    if host_ram < 1:
        raise BadInput(f"--host-ram must be a positive size, got {host_ram}")
    return host_ram


def flops_ratio(m: Measurement, base: Measurement | None) -> float | None:
    """Recompute cost: ``m``'s matmul FLOPs over ``base``'s (both traced, see flops.py)."""
    if base is None or not (m.ok and base.ok and m.matmul_flops and base.matmul_flops):
        return None
    return m.matmul_flops / base.matmul_flops


SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": GIB, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, option: str) -> int:
    """'90GiB', '96 GB', '512MiB', '1234B' -> bytes. A number with no unit is refused: a
    `--budget 90` taken as 90 bytes would fit nothing and say so only after compiling."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m and not unit:
        n = m.group(1)
        raise BadInput(f"{option}: {text!r} has no unit: a size like {n}GiB or {n}GB ({n}B for bytes)")
    if not m or unit not in SIZE_UNITS:
        raise BadInput(f"{option}: {text!r} is not a size like 90GiB, 96GB or 512MiB")
    return int(float(m.group(1)) * SIZE_UNITS[unit])


def parse_positive_size(text: str, option: str) -> int:
    """``parse_size`` for an option where zero bytes means nothing (a cap, a budget, a RAM)."""
    size = parse_size(text, option)
    if size <= 0:
        raise BadInput(f"{option} must be a positive size, got {text!r}")
    return size
