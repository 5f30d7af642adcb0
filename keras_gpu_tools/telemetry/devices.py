"""Which GPUs this process can use, as NVML devices.

CUDA numbers the GPUs a process sees from 0, in the order of
``CUDA_VISIBLE_DEVICES``; NVML numbers every GPU of the machine in PCI bus order
and knows nothing of that variable. The frameworks' ``GPU:0`` / ``cuda:0`` is
the first *visible* device, so the mapping goes through the variable, entry by
entry, by UUID where the entry is a UUID (``GPU-...``, ``MIG-...``, prefixes
allowed as CUDA allows them) and by NVML index where it is a number.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from keras_gpu_tools.telemetry.nvml import NVML, GPUInfo


class DeviceSelectionError(ValueError):
    pass


def parse_visible_devices(value: str | None) -> list | None:
    """Entries of ``CUDA_VISIBLE_DEVICES``; ``None`` when it is unset.

    CUDA stops at the first entry it cannot parse and treats ``-1`` or an empty
    value as "no GPU"; so does this.
    """
    if value is None:
        return None
    entries: list[int | str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:
                break
            entries.append(int(entry))
        else:
            entries.append(entry)
    return entries


def _match_uuid(entry: str, gpus: Sequence[GPUInfo]) -> GPUInfo | None:
    # CUDA accepts a unique UUID prefix, with or without the GPU-/MIG- prefix.
    key = entry.lower()
    candidates = [g for g in gpus if g.uuid.lower().startswith(key) or g.uuid.lower().split("-", 1)[-1].startswith(key)]
    if len(candidates) == 1:
        return candidates[0]
    return None


def _match_legacy_mig(entry: str, gpus: Sequence[GPUInfo]) -> GPUInfo | None:
    # "MIG-GPU-<uuid>/<gi>/<ci>" (drivers before R470).
    body = entry[len("MIG-") :]
    parent_uuid = body.split("/", 1)[0]
    parents = [g for g in gpus if not g.is_mig and g.uuid.lower() == parent_uuid.lower()]
    if not parents:
        return None
    migs = [g for g in gpus if g.is_mig and g.nvml_index == parents[0].nvml_index]
    return migs[0] if len(migs) == 1 else None


def visible_gpus(nvml: NVML, env: Mapping[str, str] | None = None) -> list:
    """The GPUs the process can use, in the frameworks' order (``GPU:0`` first)."""
    env = os.environ if env is None else env
    entries = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    everything = nvml.all_gpus(include_mig=True)
    physical = [g for g in everything if not g.is_mig]
    if entries is None:
        # CUDA shows MIG instances instead of their parent where MIG is on.
        out = []
        for g in physical:
            migs = [m for m in everything if m.is_mig and m.nvml_index == g.nvml_index]
            out.extend(migs[:1] if migs else [g])  # CUDA exposes one MIG device per process
        return out
    out = []
    for entry in entries:
        if isinstance(entry, int):
            match = physical[entry] if entry < len(physical) else None
        elif entry.upper().startswith("MIG-GPU-"):
            match = _match_legacy_mig(entry, everything)
        else:
            match = _match_uuid(entry, everything)
        if match is None:
            break  # CUDA ignores this entry and everything after it
        if match not in out:
            out.append(match)
    return out


DeviceSpec = int | str


def select_devices(visible: Sequence[GPUInfo], devices: Sequence[DeviceSpec] | None) -> list:
    """Picks ``devices`` out of ``visible``; returns (local_index, GPUInfo) pairs.

    An int is the framework's index (``GPU:i``), a str a UUID or UUID prefix.
    """
    if devices is None:
        return list(enumerate(visible))
    chosen = []
    for spec in devices:
        if isinstance(spec, int):
            if not 0 <= spec < len(visible):
                raise DeviceSelectionError(
                    "Invalid value for argument `devices`. "
                    f"Received: devices={list(devices)!r}; GPU index {spec} does not "
                    f"exist: this process sees {len(visible)} GPU(s)"
                    + (f" ({describe(visible)})." if visible else ".")
                    + " Expected indices as the framework numbers them (GPU:0 is 0)."
                )
            pair = (spec, visible[spec])
        else:
            match = _match_uuid(spec, visible)
            if match is None:
                raise DeviceSelectionError(
                    "Invalid value for argument `devices`. "
                    f"Received: devices={list(devices)!r}; no visible GPU has the UUID "
                    f"{spec!r}. Visible GPUs: {describe(visible) or 'none'}."
                )
            pair = (list(visible).index(match), match)
        if pair not in chosen:
            chosen.append(pair)
    return chosen


def describe(gpus: Sequence[GPUInfo]) -> str:
    return ", ".join(f"{i}: {g.label}" for i, g in enumerate(gpus))
