"""The GPUs a fit monitors: chosen among the visible ones, named in the keys, described for the logs.

A GPU's name in the keys (``gpu/<label>/...``) is the framework's index
(``GPU:<i>``), or in a job of several processes a name that no other process
of the job uses (:func:`device_label`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.topology import Topology
from keras_gpu_tools.telemetry.devices import DeviceSelectionError, select_devices, visible_gpus
from keras_gpu_tools.telemetry.nvml import NVML, GPUInfo, NVMLUnavailable

Monitored = list[tuple[int, GPUInfo]]  # (the framework's index, the GPU)


def resolve_devices(nvml: NVML, devices: Sequence[int | str] | None, warn: Callable[[Any, str], None]) -> Monitored:
    """The GPUs to monitor: ``devices`` among the visible ones (None: all); none, with a warning, without NVML.

    Raises ``ValueError`` for a device the process cannot see.
    """
    try:
        visible = visible_gpus(nvml)
    except NVMLUnavailable as e:
        warn(
            "nvml",
            f"GPUUtilizationLogger: {e}. GPU metrics are not logged; host/* metrics are. "
            "Run `keras-gpu-tools doctor` to see what the process can use.",
        )
        return []
    except Exception as e:  # a broken driver must not stop training
        warn("nvml", f"GPUUtilizationLogger: reading the GPU list from NVML failed ({e}); host/* metrics only.")
        return []
    try:
        chosen = select_devices(visible, devices)
    except DeviceSelectionError as e:
        raise ValueError(str(e)) from None
    if not chosen:
        warn(
            "nogpu",
            "GPUUtilizationLogger: NVML works but this process sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); host/* metrics only.",
        )
    return chosen


def device_label(topology: Topology, index: int, gpu: GPUInfo) -> str:
    """The GPU's name in the keys: its index alone, or one no other process of the job uses."""
    if topology.multi_process and topology.device_ids is None:
        # Processes started by a launcher on one host each see their own GPU
        # as GPU:0; NVML's index is the machine's, so it tells them apart.
        return f"{topology.host}:{gpu.nvml_index}" + (f".{gpu.mig_index}" if gpu.is_mig else "")
    return topology.device_label(index)


def device_table(topology: Topology, gpus: Monitored, labels: dict[int, str]) -> str:
    """The monitored GPUs as a Markdown table (TensorBoard's text tab)."""
    job = topology.multi_process
    lines = [f"Process {topology.process_index} of {topology.process_count} on {topology.host}.", ""] if job else []
    lines += [
        "| index | GPU | UUID | memory (MiB) | compute capability |" + (" label |" if job else ""),
        "|---|---|---|---|---|" + ("---|" if job else ""),
    ]
    for i, g in gpus:
        mem = f"{g.memory_total_bytes / 2**20:.0f}" if g.memory_total_bytes else "?"
        cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
        label = f" {labels.get(i, i)} |" if job else ""
        lines.append(f"| {i} | {g.name}{' (MIG)' if g.is_mig else ''} | {g.uuid} | {mem} | {cc} |{label}")
    return "\n".join(lines)


def device_records(topology: Topology, gpus: Monitored, labels: dict[int, str]) -> list[dict[str, Any]]:
    """The monitored GPUs as JSON-ready dicts, as written to ``gpu/devices/data`` (see the logger's ``device_records``)."""
    return [
        {
            "index": i,
            "label": labels.get(i, str(i)),
            schema.PROCESS_INDEX: topology.process_index,
            schema.PROCESS_COUNT: topology.process_count,
            schema.HOST: topology.host,
            "name": g.name,
            "uuid": g.uuid,
            "memory_total_bytes": g.memory_total_bytes,
            "compute_capability": list(g.compute_capability) if g.compute_capability else None,
            "is_mig": g.is_mig,
        }
        for i, g in gpus
    ]
