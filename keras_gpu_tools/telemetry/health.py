"""GPU health: clock-event reasons, clocks against their maxima, energy, ECC errors and XID events.

The field readers have the shape of :mod:`~keras_gpu_tools.telemetry.sampler`'s
(``reader(handle, on_unsupported) -> tuple of values``), so :class:`GPUProbe`
drops, warns about and records a field the GPU or driver cannot report the same
way for every field: absent from the logs, never 0, its reason kept
(:meth:`GPUProbe.unsupported`). DRAM bandwidth and NVLink throughput come from
GPM (``GPM_HEALTH_METRICS``, read by the sampler's GPM reader). XID events come
from one NVML event set per fit (:class:`XidWatcher`), polled without waiting.
Everything here runs on the fit session's thread, never on the training thread.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS, THROTTLE_REASONS, GPUHealthSource
from keras_gpu_tools.telemetry.nvml import NA, NVML, NVMLQueryError

__all__ = ["GPUHealthSource", "HealthRecord", "XidWatcher", "health_readers", "nvlink_links"]

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
NVML_ERROR_TIMEOUT = 10
NVLINK_MAX_LINKS = 18  # where the bindings lack NVML_NVLINK_MAX_LINKS
MAX_EVENTS_PER_TICK = 64  # a storm of events is counted over several ticks, never in one long loop
EVENT_REASONS = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE_REASONS_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"  # its name before nvidia-ml-py 12.535
ENERGY = "nvmlDeviceGetTotalEnergyConsumption"
UINT64 = 1 << 64

# GPM metric id -> key (NVML_GPM_METRIC_*). DRAM_BW_UTIL is % of the peak; the NVLink ones are
# MiB/s over all links, read only where the GPU has an active link.
GPM_DRAM_METRICS = {10: "dram_bandwidth_percent"}
GPM_NVLINK_METRICS = {60: "nvlink_rx_mib_per_sec", 61: "nvlink_tx_mib_per_sec"}

Reader = Callable[[Any, Callable[[str], None]], tuple]


def _query(nvml: NVML, func: str, *args: Any) -> Reader:
    def read(handle, on_unsupported):
        r = nvml.query(func, handle, *args, on_unsupported=on_unsupported)
        return (NA,) if r is NA else (float(r),)

    return read


class _ClockReasons:
    """Each group of clock-event reasons as 0 or 100 per sample: the epoch's mean is the share of time active."""

    def __init__(self, nvml: NVML):
        self.nvml = nvml
        self.func: str | None = None

    def __call__(self, handle, on_unsupported) -> tuple:
        if self.func is None:
            self.func = EVENT_REASONS if hasattr(self.nvml.module, EVENT_REASONS) else THROTTLE_REASONS_FN
        why: list[str] = []
        bits = self.nvml.query(self.func, handle, on_unsupported=why.append)
        if bits is NA and self.func == EVENT_REASONS and hasattr(self.nvml.module, THROTTLE_REASONS_FN):
            self.func = THROTTLE_REASONS_FN  # a driver older than the bindings knows the former name only
            bits = self.nvml.query(self.func, handle, on_unsupported=why.append)
        if bits is NA:
            if why:
                on_unsupported(why[0])
            return (NA,) * len(THROTTLE_REASONS)
        bits = int(bits)
        return tuple(100.0 if bits & mask else 0.0 for mask in THROTTLE_REASONS.values())


class _Once:
    """A value that does not change while the driver is loaded (a clock's maximum): read once."""

    def __init__(self, read: Reader):
        self.read = read
        self.value: tuple | None = None

    def __call__(self, handle, on_unsupported) -> tuple:
        if self.value is None:
            values = self.read(handle, on_unsupported)
            if any(v is NA for v in values):
                return values
            self.value = values
        return self.value


def energy_increment(previous_mj: int, current_mj: int) -> int:
    """Millijoules between two readings of NVML's total-energy counter (mJ since the driver loaded).

    A reading below the previous one is a wrap of the 64-bit counter where
    the previous was in its upper half, else a reset (the driver reloaded):
    the counter started again from 0, so the current reading is what was used
    since.
    """
    if current_mj >= previous_mj:
        return current_mj - previous_mj
    if previous_mj >= UINT64 // 2:
        return current_mj + UINT64 - previous_mj
    return current_mj


class Energy:
    """The joules used since the previous reading: each sample's share of the counter, summed per epoch.

    A reading costs milliseconds of CPU (NVML's slowest call by far), so the sampler reads it at most
    once a second; an epoch's end takes the joules since the last reading from the power
    (:meth:`split`), and the next reading pays them back, so no joule is counted twice or lost.
    """

    def __init__(self, nvml: NVML, clock: Callable[[], float] = time.monotonic):
        self.nvml = nvml
        self.clock = clock
        self.last: int | None = None
        self.read_at: float | None = None
        self.owed = 0.0  # joules an epoch's end already counted that the next reading includes
        self._lock = threading.Lock()

    def prime(self, handle) -> None:
        """Reads the counter now, so that the first sample has the energy used since."""
        r = self.nvml.query(ENERGY, handle)
        if r is not NA:
            with self._lock:
                self.last, self.read_at = int(r), self.clock()

    def __call__(self, handle, on_unsupported) -> tuple:
        r = self.nvml.query(ENERGY, handle, on_unsupported=on_unsupported)
        if r is NA:
            return (NA,)
        with self._lock:
            previous, self.last, self.read_at = self.last, int(r), self.clock()
            if previous is None:
                return (NA,)
            joules = energy_increment(previous, self.last) / 1000.0
            paid = min(joules, self.owed)
            self.owed -= paid
            return (joules - paid,)

    def split(self, watts: float | None) -> float:
        """Joules since the last reading, from ``watts`` (the power now): counted by the epoch ending now."""
        if watts is None or not math.isfinite(watts):
            return 0.0
        with self._lock:
            if self.read_at is None:
                return 0.0
            now = self.clock()
            joules = max(0.0, watts) * max(0.0, now - self.read_at)
            self.read_at = now
            self.owed += joules
            return joules


def health_readers(nvml: NVML) -> list[tuple[tuple[str, ...], Reader]]:
    """The health fields read per sample, as (keys, reader) in the sampler's shape."""
    return [
        (tuple(THROTTLE_REASONS), _ClockReasons(nvml)),
        (("memory_clock_mhz",), _query(nvml, "nvmlDeviceGetClockInfo", NVML_CLOCK_MEM)),
        (("sm_clock_max_mhz",), _Once(_query(nvml, "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM))),
        (("memory_clock_max_mhz",), _Once(_query(nvml, "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM))),
        (("energy_joules",), Energy(nvml)),
        (
            ("ecc_corrected_errors",),
            _query(nvml, "nvmlDeviceGetTotalEccErrors", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
        ),
        (
            ("ecc_uncorrected_errors",),
            _query(nvml, "nvmlDeviceGetTotalEccErrors", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
        ),
    ]


def nvlink_links(nvml: NVML, handle) -> tuple[int, str]:
    """The GPU's active NVLink links, and why there are none (empty when there are)."""
    limit = int(getattr(nvml.module, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))
    active = 0
    for link in range(limit):
        why: list[str] = []
        try:
            state = nvml.query("nvmlDeviceGetNvLinkState", handle, link, on_unsupported=why.append)
        except NVMLQueryError:  # past the GPU's last link (InvalidArgument)
            break
        if state is NA:
            if link == 0:
                return 0, f"this GPU has no NVLink ({why[0] if why else 'not supported'})"
            break
        active += 1 if state else 0
    return active, "" if active else "no NVLink link of this GPU is active"


class _Watched(Protocol):
    """What the XID watcher needs of a GPU probe."""

    label: str
    prefix: str
    gpu: Any
    unsupported: dict[str, str]


class XidWatcher:
    """XID critical errors of the monitored GPUs: one NVML event set per fit, polled without waiting.

    :meth:`poll` (each sample, on the fit session's thread) returns each
    watched GPU's events since the last poll as ``gpu/<label>/xid_events``
    and warns once per GPU and XID code, naming the GPU by label and UUID.
    :meth:`close` frees the event set; the logger calls it when the fit
    ends, also when fit() raised.
    """

    def __init__(self, nvml: NVML, probes: Sequence[_Watched], warn: WarnOnce):
        self.nvml = nvml
        self.probes = list(probes)
        self.warn = warn
        self._set: Any = None
        self._started = False
        self._by_uuid: dict[str, list[_Watched]] = {}  # the physical GPU's UUID -> the probes on it
        self._lock = threading.Lock()

    def _unsupported(self, probes: Iterable[_Watched], reason: str) -> None:
        for p in probes:
            p.unsupported["xid_events"] = reason
            self.warn((p.label, "xid_events"), f"GPU {p.label} ({p.gpu.name}): xid_events not available ({reason}).")

    def _physical(self, probe: _Watched) -> tuple[Any, str]:
        handle, uuid = probe.gpu.handle, probe.gpu.uuid
        if probe.gpu.is_mig:  # XID events are the physical GPU's
            handle = self.nvml.query("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            uuid = _text(self.nvml.query("nvmlDeviceGetUUID", handle)) if handle is not NA else ""
        return handle, uuid

    def start(self) -> None:
        """Creates the event set and registers each GPU for XID events (once; a failure is the field's reason)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            why: list[str] = []
            try:
                event_set = self.nvml.query("nvmlEventSetCreate", on_unsupported=why.append)
            except NVMLQueryError as e:
                event_set, why = NA, [str(e)]
            if event_set is NA:
                self._unsupported(self.probes, f"no NVML event set: {why[0] if why else 'not supported'}")
                return
            self._set = event_set
            for probe in self.probes:
                handle, uuid = self._physical(probe)
                if uuid in self._by_uuid:
                    self._by_uuid[uuid].append(probe)
                    continue
                why = []
                try:
                    r = self.nvml.query(
                        "nvmlDeviceRegisterEvents",
                        handle,
                        NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                        event_set,
                        on_unsupported=why.append,
                    )
                except NVMLQueryError as e:
                    r, why = NA, [str(e)]
                if handle is NA or (r is NA and why):
                    self._unsupported([probe], f"XID events cannot be registered: {why[0] if why else 'no handle'}")
                    continue
                self._by_uuid[uuid] = [probe]
            if not self._by_uuid:
                self._free()

    def poll(self) -> dict[str, float]:
        """``gpu/<label>/xid_events``: each watched GPU's XID events since the last poll."""
        if not self._started:
            self.start()
        with self._lock:
            if self._set is None:
                return {}
            counts = {p.prefix + "xid_events": 0.0 for ps in self._by_uuid.values() for p in ps}
            module = self.nvml.module
            wait = getattr(module, "nvmlEventSetWait_v2", None) or module.nvmlEventSetWait  # older bindings
            for _ in range(MAX_EVENTS_PER_TICK):
                try:
                    data = wait(self._set, 0)
                except module.NVMLError as e:
                    if getattr(e, "value", None) == NVML_ERROR_TIMEOUT:  # no event waiting
                        break
                    reason = f"waiting for XID events failed ({type(e).__name__}: {e})"
                    self._unsupported([p for ps in self._by_uuid.values() for p in ps], reason)
                    self._free()
                    return {}
                if not int(getattr(data, "eventType", 0)) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                    continue
                code = int(data.eventData)
                uuid = _text(self.nvml.query("nvmlDeviceGetUUID", data.device))
                for p in self._by_uuid.get(uuid, []):
                    counts[p.prefix + "xid_events"] += 1.0
                    self.warn(
                        (p.label, "xid", code),
                        f"GPU {p.label} ({p.gpu.name}, {uuid}): the driver reported XID {code}, a GPU error "
                        "(see NVIDIA's XID catalogue for its meaning); training goes on, check the GPU.",
                    )
            return counts

    def _free(self) -> None:
        event_set, self._set = self._set, None
        if event_set is not None:
            try:
                self.nvml.module.nvmlEventSetFree(event_set)
            except Exception:  # already gone with NVML: nothing left to free
                pass

    def close(self) -> None:
        """Frees the event set (safe to call twice)."""
        with self._lock:
            self._free()


def _text(value) -> str:
    if value is NA or value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@functools.lru_cache(maxsize=8192)
def _gpu_key_parts(key: str) -> tuple[str, str] | None:
    """(label, field) of a ``gpu/<label>/<field>`` key, else None; cached: a fit has a fixed set of keys."""
    m = schema.GPU_KEY_RE.match(key)
    return (m.group(1), m.group(2)) if m is not None else None


class HealthRecord:
    """The logger's :class:`GPUHealthSource`: the last epoch's GPU figures and the unsupported fields.

    Args:
        unsupported: returns GPU label -> field -> reason (the sampler's record).
    """

    def __init__(self, unsupported: Callable[[], dict[str, dict[str, str]]]):
        self._unsupported = unsupported
        self._last: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def end_epoch(self, values: dict[str, float], samples: int | None) -> dict[str, float]:
        """Keeps the epoch's GPU figures; returns ``throughput/joules_per_sample`` where it can be known.

        It is the epoch's energy over every GPU of the process, over the
        epoch's ``samples``: left out without them, or where a GPU cannot
        report its energy.
        """
        per_gpu: dict[str, dict[str, float]] = {}
        for key, value in values.items():
            parts = _gpu_key_parts(key)
            if parts is not None:
                per_gpu.setdefault(parts[0], {})[parts[1]] = value
        with self._lock:
            self._last = per_gpu
        energy = [fields.get("energy_joules") for fields in per_gpu.values()]
        if not samples or not energy or any(e is None for e in energy):
            return {}
        return {schema.JOULES_PER_SAMPLE: sum(e for e in energy if e is not None) / samples}

    def last_epoch(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {label: dict(fields) for label, fields in self._last.items()}

    def unsupported(self) -> dict[str, dict[str, str]]:
        return {label: dict(fields) for label, fields in self._unsupported().items()}


def unsupported_text(record: dict[str, dict[str, str]]) -> str:
    """The readable list of the fields each GPU cannot report (TensorBoard's Text tab, ``summary()``)."""
    lines = []
    for label, fields in record.items():
        if not fields:
            lines.append(f"GPU {label}: every field is reported.")
            continue
        lines.append(f"GPU {label}: {len(fields)} field(s) not reported:")
        lines += [f"- {field}: {reason}" for field, reason in fields.items()]
    return "\n".join(lines) if lines else "No GPU monitored."


def write_unsupported(writer: Any, record: dict[str, dict[str, str]], step: int) -> None:
    """The fit's record of unsupported fields into its run: text and JSON under ``GPU_UNSUPPORTED_TEXT``."""
    writer.text(schema.GPU_UNSUPPORTED_TEXT, unsupported_text(record), step=step)
    writer.json(schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX, record, step=step)


def summary_text(source: GPUHealthSource, labels: Sequence[str]) -> str:
    """The logger's ``summary()``: each GPU's last epoch of health figures and the fields it cannot report."""
    if not labels:
        return "GPUUtilizationLogger: no GPU monitored in the last fit."
    last, unsupported = source.last_epoch(), source.unsupported()
    lines = ["GPUUtilizationLogger: the last epoch's GPU health"]
    for label in labels:
        fields = last.get(label, {})
        shown = [f"{k} {fields[k]:.4g}" for k in HEALTH_FIELDS if k in fields]
        lines.append(f"GPU {label}: " + (", ".join(shown) if shown else "no epoch ended yet"))
    return "\n".join(lines + ["", unsupported_text({label: unsupported.get(label, {}) for label in labels})])


def field_support(nvml: NVML, probe: Any, xid: XidWatcher, wait: Callable[[float], None]) -> dict[str, str | None]:
    """Each health field of one GPU: None where it is reported, else why not (``doctor``).

    Reads the GPU the way a fit does: a prime, a sample ``0.1`` s later (GPM
    rates need two), and the XID registration.
    """
    probe.prime()
    wait(0.1)
    keys = set(probe.read())
    xid.start()
    out: dict[str, str | None] = {}
    for field in HEALTH_FIELDS:
        if probe.prefix + field in keys or (field == "xid_events" and field not in probe.unsupported):
            out[field] = None
        else:
            out[field] = probe.unsupported.get(field, "not read (the GPU stopped answering, or GPM is switched off)")
    return out
