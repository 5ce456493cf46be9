"""Compile targets: deviceless TPU topologies through libtpu, deviceless NVIDIA GPUs through
the JAX CUDA plugin (the ``gpu`` extra), and the local CPU backend.

Nothing here imports JAX: a ``Target`` is plain data; ``memprobe.build`` makes devices.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import mmap
import platform
import re
from pathlib import Path

from memprobe.errors import BadInput, unknown

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class TpuKind:
    name: str
    device_kind: str
    devices_per_chip: int
    dims: int  # 2 for v5e/v6e topologies (AxB), 3 for the others (AxBxC)
    hbm_gib: float  # per device, as the compiler enforces it (its OOM text, GiB to 2 places)
    default_devices: int
    chip_config: str | None = None
    note: str = ""
    # TensorCores behind one device, which is what a Cloud TPU accelerator type counts:
    # v5p-8 and v4-8 are 4 chips of 2 cores run as one (megacore) device each; tpu7x-8 is
    # 4 chips whose 2 cores are 2 devices; v5e-4 and v6e-4 are 4 single-core chips.
    cores_per_device: int = 1

    def accelerator_type(self, devices: int) -> str:
        return f"{self.name}-{devices * self.cores_per_device}"

    @property
    def hbm_bytes(self) -> int:
        return round(self.hbm_gib * GIB)


TPU_KINDS: dict[str, TpuKind] = {
    k.name: k
    for k in (
        TpuKind("tpu7x", "TPU7x", 2, 3, 94.74, 8, note="Ironwood; 2 devices per chip"),
        TpuKind("v6e", "TPU v6 lite", 1, 2, 31.24, 4, note="Trillium"),
        TpuKind("v5p", "TPU v5", 1, 3, 95.73, 4, cores_per_device=2),
        TpuKind("v5e", "TPU v5 lite", 1, 2, 15.75, 4),
        # Real v4 jobs run in megacore mode: one device per chip with both cores' HBM.
        TpuKind("v4", "TPU v4", 1, 3, 30.75, 4, chip_config="megacore", note="megacore", cores_per_device=2),
    )
}
_TYPE_ALIASES = {"v5litepod": "v5e"}  # Cloud TPU's name for v5e slices

_SHAPES_3D = {1: "1x1x1", 2: "1x2x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4",
              64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}
_SHAPES_2D = {1: "1x1", 2: "1x2", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
              128: "8x16", 256: "16x16"}

DEFAULT_TARGET = "tpu7x"


def target_or_default(name: str | None, topology: str | None = None) -> str:
    """--target as given; left out, the TPU kind a --topology like v5p:2x2x1 names, or else
    the default target (tpu7x), so that `--topology v5p:2x2x1` alone means a v5p slice."""
    if name is not None:
        return name
    kind = _topology_kind(topology)
    return kind or DEFAULT_TARGET


def _topology_prefix(topology: str | None) -> str | None:
    """The word a topology names before its shape (v5p of v5p:2x2x1; none in 2x2x1), in lower
    case: a TPU kind, or one memprobe does not know."""
    m = re.match(r"([a-z][a-z0-9]*)[:=_]", (topology or "").strip().lower())
    return m.group(1) if m else None


def _topology_kind(topology: str | None) -> str | None:
    """The TPU kind a topology names before its shape (v5p of v5p:2x2x1), if any."""
    prefix = _topology_prefix(topology)
    return prefix if prefix in TPU_KINDS else None


# GPU targets: the compiler target configs (GpuTargetConfigProto, text format) that the
# installed JAX CUDA plugin ships, by their device_description_str. The plugin is read,
# not copied, so capacities and compiler parameters always match the compiler in use.
# The NVIDIA training GPUs among them; a tiny train step under checkpoint and offload was
# compiled for each here (tests/test_compile_gpu.py compiles for h100 and b300).
GPU_KINDS: dict[str, str] = {
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200 141GB HBM3e",
    "b200": "NVIDIA B200",
    "a100": "NVIDIA A100-SXM4-80GB",
    "b300": "NVIDIA B300",
    "gb200": "NVIDIA GB200",
    "gb300": "NVIDIA GB300",
    "h100-pcie": "NVIDIA H100 PCIe",
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "rtx-pro-6000": "NVIDIA RTX PRO 6000 Blackwell",
}
GPU_DEFAULT_DEVICES = 8
GPU_EXTRA = "pip install -c constraints.txt -e '.[gpu]' (or ./scripts/setup.sh --gpu)"


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a train step is compiled for. ``hbm_bytes`` is per device; None where unknown."""

    platform: str  # "tpu", "cuda" or "cpu"
    name: str  # "tpu7x", "v5p", ..., "h100", ..., "cpu"
    num_devices: int
    topology: str | None = None
    chip_config: str | None = None
    hbm_bytes: int | None = None
    gpu_config: str | None = None  # the plugin's target config, by its device description

    @property
    def has_host_memory(self) -> bool:
        """Whether the compiler has a pinned-host memory space to offload to (CPU: no)."""
        return self.platform != "cpu"

    @property
    def label(self) -> str:
        devices = f"{self.num_devices} device{'s' if self.num_devices > 1 else ''}"
        return f"{self.topology or self.name} ({devices})"



def _tpu_topology_devices(kind: TpuKind, topology: str, option: str = "--topology") -> int:
    m = re.fullmatch(rf"{re.escape(kind.name)}[:=_](\d+(?:x\d+){{1,2}})", topology)
    if not m:
        raise BadInput(f"{option}: {topology!r} is not a {kind.name} topology like "
                       f"{kind.name}:{(_SHAPES_3D if kind.dims == 3 else _SHAPES_2D)[4]}")
    return math.prod(int(a) for a in m.group(1).split("x")) * kind.devices_per_chip


def _with_kind(kind: str, topology: str, target: str) -> str:
    """A --topology with the target's kind before its shape (2x2x1 -> v5p:2x2x1); one that
    names another kind (v5e:2x2 for --target v5p) is refused rather than read as v5p's."""
    other = _topology_prefix(topology)
    if other is not None and other not in TPU_KINDS:  # v9:2x2x1 was read as tpu7x's "tpu7x:v9:2x2x1"
        raise unknown("TPU kind", other, TPU_KINDS, f"--topology {topology}: ")
    if other is not None and other != kind:
        named = target if target == kind else f"{target} (a {kind})"
        raise BadInput(f"--topology {topology} is for {other}, not for --target {named}; leave --target "
                       f"out, or give --target {other}")
    return topology if other else f"{kind}:{topology}"


def _split_target(name: str, devices: int | None, topology: str | None):
    """--target as a kind and topology (v5p:2x2x1) or a Cloud TPU accelerator type (v5p-8,
    v5litepod-16) taken apart: (kind, devices, topology, and the options that the topology
    and the device count came from, for errors)."""
    kind_part, sep, shape = name.partition(":")
    if sep and kind_part in TPU_KINDS:  # the form libtpu and `memprobe targets` print
        if topology and topology.removeprefix(f"{kind_part}:") != shape:
            raise BadInput(f"--target {name} contradicts --topology {topology}")
        return kind_part, devices, name, "--target", "--devices"
    m = re.fullmatch(r"([a-z0-9]+)-(\d+)", name)
    kind = TPU_KINDS.get(_TYPE_ALIASES.get(m.group(1), m.group(1))) if m else None
    if kind is None:
        return name, devices, topology, "--topology", "--devices"
    cores = int(m.group(2))
    if cores < 1:
        raise BadInput(f"--target {name}: an accelerator type counts TensorCores, at least 1")
    if cores % kind.cores_per_device:
        raise BadInput(f"--target {name}: {kind.name} accelerator types count TensorCores, "
                       f"{kind.cores_per_device} per device, so {cores} is not a whole number of devices")
    n = cores // kind.cores_per_device
    if devices is not None and devices != n:
        raise BadInput(f"--devices {devices} contradicts --target {name} ({n} devices)")
    if topology:
        topology = _with_kind(kind.name, topology, name)
        if _tpu_topology_devices(kind, topology) != n:
            raise BadInput(f"--target {name} ({n} devices) contradicts --topology {topology}")
    return kind.name, n, topology, "--topology", f"--target {name}"


def resolve_target(name: str, devices: int | None = None, topology: str | None = None) -> Target:
    """A target from the CLI's --target/--devices/--topology; libtpu checks the topology later."""
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise BadInput(f"--devices must be a positive integer, got {devices!r}")
    if "," in name:  # several targets are for compare, baseline and fit, each planned on its own
        raise BadInput(f"--target {name}: one target here (compare, baseline and fit take several)")
    # Names as the vendors write them (H100, TPU7x, V5P-8) are the same targets.
    name, topology = name.strip().lower(), topology.strip().lower() if topology else topology
    name, devices, topology, option, devices_option = _split_target(name, devices, topology)
    if name == "cpu":
        if topology:
            raise BadInput("--topology applies to TPU targets only; use --devices for cpu")
        return Target(platform="cpu", name="cpu", num_devices=devices or 1)
    if name in GPU_KINDS:
        if topology:
            raise BadInput("--topology applies to TPU targets only; use --devices for GPU targets")
        config = gpu_target_config(GPU_KINDS[name])
        return Target(platform="cuda", name=name, num_devices=devices or GPU_DEFAULT_DEVICES,
                      hbm_bytes=config_memory_bytes(config), gpu_config=GPU_KINDS[name])
    if name not in TPU_KINDS:
        raise unknown("target", name, [*TPU_KINDS, *GPU_KINDS, "cpu"])
    kind = TPU_KINDS[name]
    if topology:
        topology = _with_kind(name, topology, name)
        n = _tpu_topology_devices(kind, topology, option)
        if devices is not None and devices != n:
            raise BadInput(f"--devices {devices} contradicts {option} {topology} ({n} devices)")
        devices = n
    else:
        devices = devices or kind.default_devices
        if devices % kind.devices_per_chip:
            raise BadInput(f"{devices_option}: {name} has {kind.devices_per_chip} devices per chip, "
                           f"so {devices} is not a whole number of chips")
        chips = devices // kind.devices_per_chip
        shapes = _SHAPES_3D if kind.dims == 3 else _SHAPES_2D
        if chips not in shapes:
            raise BadInput(f"{devices_option}: no standard {name} topology has {devices} devices "
                           f"(try {', '.join(str(c * kind.devices_per_chip) for c in shapes)} "
                           "or pass --topology)")
        topology = f"{name}:{shapes[chips]}"
    return Target(platform="tpu", name=name, num_devices=devices, topology=topology,
                  chip_config=kind.chip_config, hbm_bytes=kind.hbm_bytes)


GPUS_PER_HOST = 8  # an HGX/DGX node
# Grace-Blackwell racks (NVL72) hold 4 GPUs per compute tray, each tray its own host.
GPU_HOST_SIZES: dict[str, int] = {"gb200": 4, "gb300": 4}


def gpus_per_host(name: str) -> int:
    return GPU_HOST_SIZES.get(name, GPUS_PER_HOST)


def devices_per_host(platform: str, name: str, num_devices: int, topology: str | None) -> int | None:
    """How many of a slice's devices share one host (and so its RAM), by default: for TPU, as
    libtpu's compile-only topologies lay hosts out (2x2 chips, fewer along a shorter side;
    real single-host slices such as an 8-chip v5e or v6e VM have more); for GPU, an 8-GPU node
    (a 4-GPU compute tray for GB200 and GB300);
    None for the CPU backend, which has no host memory space of its own."""
    if platform == "tpu":
        kind = TPU_KINDS.get(name)
        dims = re.search(r"(\d+(?:x\d+)+)$", topology or "")
        if kind is None or dims is None:
            return None
        a, b = (int(d) for d in dims.group(1).split("x")[:2])
        return min(a, 2) * min(b, 2) * kind.devices_per_chip
    if platform == "cuda":
        return min(num_devices, gpus_per_host(name))
    return None


def require_backend(target: Target) -> None:
    """Refuses a target whose compiler is not installed here, before anything compiles."""
    if target.platform == "cuda":
        try:
            nvcc = importlib.util.find_spec("nvidia.cuda_nvcc") is not None
        except (ImportError, ValueError):
            nvcc = False
        if not nvcc:  # without ptxas and libdevice from the extra, XLA would use whatever CUDA is here
            raise BadInput(f"--target {target.name}: the CUDA compiler tools are not installed: {GPU_EXTRA}")
        return
    if target.platform != "tpu":
        return
    try:
        found = importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        where = f"{platform.system()} {platform.machine()}"
        raise BadInput(f"--target {target.name}: needs libtpu, which is not installed here ({where}); "
                       "libtpu ships for Linux x86-64 only: pip install libtpu, or use --target cpu")


def _cuda_plugin_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


@functools.cache
def gpu_target_configs() -> dict[str, str]:
    """The installed CUDA plugin's target configs (text protos), by device description."""
    where = _cuda_plugin_dir()
    so = where / "xla_cuda_plugin.so" if where else None
    if so is None or not so.exists():
        raise BadInput(f"GPU targets need the JAX CUDA plugin, which is not installed: {GPU_EXTRA}")
    configs = {}
    # Mapped, not read: the library is about 450 MB and only a few KB of it are wanted.
    with open(so, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for m in re.finditer(rb"gpu_device_info \{", data):
            text = data[m.start():data.find(b"\0", m.start())].decode("utf-8", "replace")
            desc = re.search(r'device_description_str: "([^"]*)"', text)
            if desc:
                configs[desc.group(1)] = text
    return configs


def gpu_target_config(description: str) -> str:
    configs = gpu_target_configs()
    if description not in configs:
        raise BadInput(f"the installed CUDA plugin has no target config for {description!r} "
                       f"(it has: {', '.join(sorted(configs))})")
    return configs[description]


def config_memory_bytes(config: str) -> int:
    """device_memory_size of a GPU target config: the HBM the compiler is told about."""
    return int(re.search(r"device_memory_size: (\d+)", config).group(1))
