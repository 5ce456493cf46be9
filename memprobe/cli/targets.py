"""`memprobe targets`: what can be compiled for, with per-device capacity."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

from memprobe.render import terminal_width
from memprobe.render.columns import Column, fitted_table
from memprobe.errors import BadInput
from memprobe.targets import (DEFAULT_TARGET, GPU_DEFAULT_DEVICES, GPU_EXTRA, GPU_KINDS, GPUS_PER_HOST, TPU_KINDS,
                              devices_per_host, resolve_target)


def list_targets() -> int:
    """List compile targets: deviceless TPU kinds through libtpu, deviceless NVIDIA GPUs through
    the CUDA plugin (the gpu extra), and the local CPU."""
    caption = ("HBM: per device (GiB = 2^30 bytes); TPU: as the TPU compiler enforces it; GPU: "
               "device_memory_size of the target config the installed CUDA plugin ships (the GPU compiler "
               "does not enforce it). CPU figures do not stand for any accelerator. devices/host: how many "
               "devices share one host's RAM by default, for --host-ram (TPU: as libtpu lays hosts out). "
               "accelerator type: the Cloud TPU name of the default slice, which --target takes too "
               "(v5p-256, v5litepod-16); it counts TensorCores, so v5p-8 and v4-8 are 4 devices.")
    columns = [Column("target", justify="left"), Column("default topology", justify="left"),
               Column("accelerator type", justify="left", drop=3),
               Column("devices", justify="left", wrap=True), Column("devices/chip", justify="left", drop=1),
               Column("devices/host", justify="left", drop=2), Column("HBM GiB/device", justify="left"),
               Column("note", justify="left", wrap=True)]
    rows = []
    for kind in TPU_KINDS.values():
        tgt = resolve_target(kind.name)
        note = ", ".join(x for x in (kind.note, "default" if kind.name == DEFAULT_TARGET else "") if x)
        per_host = devices_per_host(tgt.platform, tgt.name, tgt.num_devices, tgt.topology)
        rows.append([kind.name, tgt.topology, kind.accelerator_type(tgt.num_devices), str(tgt.num_devices), str(kind.devices_per_chip), str(per_host),
                     f"{kind.hbm_gib:.2f}", note])
    for name, description in GPU_KINDS.items():
        try:
            tgt = resolve_target(name)
            hbm, note = f"{tgt.hbm_bytes / 2**30:.2f}", f"{description} ({tgt.hbm_bytes:,} bytes)"
        except BadInput:
            hbm, note = "-", f"{description}; needs the gpu extra: {GPU_EXTRA}"
        rows.append([name, "-", "-", f"{GPU_DEFAULT_DEVICES} (--devices N)", "1", str(GPUS_PER_HOST), hbm, note])
    rows.append(["cpu", "-", "-", "1 (--devices N)", "-", "-", "-", "XLA CPU backend, local"])
    width = terminal_width(sys.stdout)
    table = fitted_table("memprobe targets", columns, [[escape(c) for c in row] for row in rows], [caption],
                         width, full=None)
    Console(width=width).print(table)
    return 0
