"""`memprobe targets`: what can be compiled for, with per-device capacity."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from memprobe.render import ListFormat, terminal_width
from memprobe.render.columns import Column, fitted_table
from memprobe.errors import BadInput
from memprobe.targets import (DEFAULT_TARGET, GPU_DEFAULT_DEVICES, GPU_EXTRA, GPU_KINDS, TPU_KINDS,
                              devices_per_host, gpus_per_host, require_backend, resolve_target)


def list_targets(fmt: Annotated[ListFormat, typer.Option(
        "--format", help="table, or json: one object per target with exact bytes, for scripts.")] = ListFormat.TABLE,
                 ) -> int:
    """List compile targets: deviceless TPU kinds through libtpu, deviceless NVIDIA GPUs through
    the CUDA plugin (the gpu extra), and the local CPU."""
    targets = target_rows()
    if fmt is ListFormat.JSON:
        print(json.dumps(targets, indent=2))
        return 0
    caption = ("HBM: per device (GiB = 2^30 bytes); TPU: as the TPU compiler enforces it; GPU: "
               "device_memory_size of the target config the installed CUDA plugin ships (the GPU compiler "
               "does not enforce it). CPU figures do not stand for any accelerator. devices/host: how many "
               "devices share one host's RAM by default, for --host-ram (TPU: as libtpu lays hosts out; GPU: "
               "an 8-GPU node, or a 4-GPU tray for GB200 and GB300). "
               "accelerator type: the Cloud TPU name of the default slice, which --target takes too "
               "(v5p-256, v5litepod-16); it counts TensorCores, so v5p-8 and v4-8 are 4 devices.")
    columns = [Column("target", justify="left"), Column("default topology", justify="left"),
               Column("accelerator type", justify="left", drop=3),
               Column("devices", justify="left", wrap=True), Column("devices/chip", justify="left", drop=1),
               Column("devices/host", justify="left", drop=2), Column("HBM GiB/device", justify="left"),
               Column("note", justify="left", wrap=True)]
    rows = []
    for t in targets:
        gpu_or_cpu = t["platform"] != "tpu"
        devices = f"{t['devices']} (--devices N)" if gpu_or_cpu else str(t["devices"])
        if t["platform"] == "cuda":
            note = (f"{t['description']} ({t['hbm_bytes']:,} bytes)" if t["hbm_bytes"] is not None
                    else t["description"])
            note += "" if t["available"] else f"; needs the gpu extra: {GPU_EXTRA}"
        else:
            note = ", ".join(x for x in (t["description"], "default" if t["default"] else "",
                                         "" if t["available"] else "needs libtpu (Linux x86-64)") if x)
        hbm = "-" if t["hbm_bytes"] is None else f"{t['hbm_bytes'] / 2**30:.2f}"
        rows.append([t["target"], t["default_topology"] or "-", t["accelerator_type"] or "-", devices,
                     _or_dash(t["devices_per_chip"]), _or_dash(t["devices_per_host"]), hbm, note])
    width = terminal_width(sys.stdout)
    table = fitted_table("memprobe targets", columns, [[escape(c) for c in row] for row in rows], [caption],
                         width, full=None)
    Console(width=width).print(table)
    return 0


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _compiles_here(target) -> bool:
    try:
        require_backend(target)
    except BadInput:
        return False
    return True


def target_rows() -> list[dict[str, Any]]:
    """Every target with its defaults: what the table shows and `--format json` writes.
    ``available``: its compiler is installed here. HBM per device: a TPU's is the figure the
    TPU compiler enforces, which it prints in GiB to two decimals (``hbm_gib``; its bytes
    are that figure's, exact to about 5 MiB); a GPU's is its target config's
    device_memory_size to the byte (None without the gpu extra); the CPU backend has none."""
    rows = []
    for kind in TPU_KINDS.values():
        tgt = resolve_target(kind.name)
        rows.append(dict(target=kind.name, platform="tpu", available=_compiles_here(tgt),
                         default=kind.name == DEFAULT_TARGET,
                         default_topology=tgt.topology, accelerator_type=kind.accelerator_type(tgt.num_devices),
                         devices=tgt.num_devices, devices_per_chip=kind.devices_per_chip,
                         devices_per_host=devices_per_host(tgt.platform, tgt.name, tgt.num_devices, tgt.topology),
                         hbm_bytes=kind.hbm_bytes, hbm_gib=kind.hbm_gib,
                         hbm_source="the TPU compiler's out-of-memory message (GiB to 2 places)",
                         description=kind.note))
    for name, description in GPU_KINDS.items():
        try:
            tgt = resolve_target(name)
            hbm, available = tgt.hbm_bytes, _compiles_here(tgt)
        except BadInput:  # no CUDA plugin, so no target config to read
            hbm, available = None, False
        rows.append(dict(target=name, platform="cuda", available=available, default=False, default_topology=None,
                         accelerator_type=None, devices=GPU_DEFAULT_DEVICES, devices_per_chip=1,
                         devices_per_host=gpus_per_host(name), hbm_bytes=hbm,
                         hbm_gib=None if hbm is None else round(hbm / 2**30, 2),
                         hbm_source="device_memory_size of the CUDA plugin's target config", description=description))
    rows.append(dict(target="cpu", platform="cpu", available=True, default=False, default_topology=None,
                     accelerator_type=None, devices=1, devices_per_chip=None, devices_per_host=None,
                     hbm_bytes=None, hbm_gib=None, hbm_source=None,
                     description="XLA CPU backend, local"))
    return rows
