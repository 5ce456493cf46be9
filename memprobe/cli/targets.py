"""`memprobe targets`: what can be compiled for, with per-device capacity."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from memprobe.render import terminal_width
from memprobe.errors import BadInput
from memprobe.targets import (DEFAULT_TARGET, GPU_DEFAULT_DEVICES, GPU_EXTRA, GPU_KINDS, GPUS_PER_HOST, TPU_KINDS,
                              devices_per_host, resolve_target)


def list_targets() -> int:
    """List compile targets: deviceless TPU kinds through libtpu, deviceless NVIDIA GPUs through
    the CUDA plugin (the gpu extra), and the local CPU."""
    t = Table(title="memprobe targets", caption="HBM: per device (GiB = 2^30 bytes); TPU: as the TPU "
              "compiler enforces it; GPU: device_memory_size of the target config the installed CUDA "
              "plugin ships (the GPU compiler does not enforce it). CPU figures do not stand for any "
              "accelerator. devices/host: how many devices share one host's RAM by default, for --host-ram (TPU: as libtpu lays hosts out).", caption_justify="left")
    for col in ("target", "default topology", "devices", "devices/chip", "devices/host", "HBM GiB/device", "note"):
        t.add_column(col)
    for kind in TPU_KINDS.values():
        tgt = resolve_target(kind.name)
        note = ", ".join(x for x in (kind.note, "default" if kind.name == DEFAULT_TARGET else "") if x)
        per_host = devices_per_host(tgt.platform, tgt.name, tgt.num_devices, tgt.topology)
        t.add_row(kind.name, tgt.topology, str(tgt.num_devices), str(kind.devices_per_chip), str(per_host),
                  f"{kind.hbm_gib:.2f}", note)
    for name, description in GPU_KINDS.items():
        try:
            tgt = resolve_target(name)
            hbm, note = f"{tgt.hbm_bytes / 2**30:.2f}", f"{description} ({tgt.hbm_bytes:,} bytes)"
        except BadInput:
            hbm, note = "-", f"{description}; needs the gpu extra: {GPU_EXTRA}"
        t.add_row(name, "-", f"{GPU_DEFAULT_DEVICES} (--devices N)", "1", str(GPUS_PER_HOST), hbm, note)
    t.add_row("cpu", "-", "1 (--devices N)", "-", "-", "-", "XLA CPU backend, local")
    Console(width=terminal_width(sys.stdout)).print(t)
    return 0
