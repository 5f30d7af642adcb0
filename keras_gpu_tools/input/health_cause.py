"""Why a process of a job is slow, where its GPU's health says: throttling, a lower SM clock, another load.

Nothing here knows about Keras or NVML. At each epoch end every process adds
to its row a summary of its GPUs' health in that epoch (:func:`process_health`,
from the ``GPUUtilizationLogger`` of the same fit, through the
:class:`~keras_gpu_tools.telemetry.health_fields.GPUHealthSource` it publishes;
absent without one). :func:`health_causes` compares a process's summary with
the median of the *other* processes' and names a cause only where its figure
stands out, by a relative and an absolute margin, as the straggler rule does:

- a throttle reason (power cap, thermal slowdown, hardware slowdown): active
  at least ``THROTTLE_AT_LEAST`` (10%) of the epoch and ``THROTTLE_POINTS``
  (15 points) more than on the others;
- the SM clock: at most ``CLOCK_RATIO`` (0.93x) of the others' and at least
  ``CLOCK_AT_LEAST_MHZ`` (50 MHz) lower (against each GPU's maximum where
  every process knows it, so GPUs of different models compare fairly);
- another load on its GPU: NVML's utilization (any kernel running, whoever
  runs it) at least ``LOAD_POINTS`` (30 points) above the share of the step
  its own steps keep the device busy (compute / step time), and that excess
  ``LOAD_POINTS`` more than the others'.

A process with several GPUs sends, per figure, its GPU that fares worst
(the most throttled, the slowest clock), named by its label.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from keras_gpu_tools.runtime.units import format_milliseconds

THROTTLE_AT_LEAST = 10.0  # % of the epoch
THROTTLE_POINTS = 15.0  # points above the others' median
CLOCK_RATIO = 0.93
CLOCK_AT_LEAST_MHZ = 50.0
LOAD_POINTS = 30.0
SLOWER_AT_LEAST = 0.03  # a step this much longer than the others' is called slower

# The throttle reasons that slow a GPU down, the words of the verdict and what to do about each.
THROTTLES: dict[str, tuple[str, str]] = {
    "throttle_power_percent": (
        "power-throttled",
        "its GPU hits its power limit: compare `nvidia-smi -q -d POWER` with the other nodes' (a lowered limit, "
        "set with `nvidia-smi -pl`, or a weaker power supply)",
    ),
    "throttle_thermal_percent": (
        "thermally throttled",
        "its GPU runs too hot: check the node's cooling (fans, airflow, a neighbour's exhaust) with "
        "`nvidia-smi -q -d TEMPERATURE`",
    ),
    "throttle_hw_slowdown_percent": (
        "slowed down by the hardware (power brake or slowdown signal)",
        "its GPU is held down by the hardware (power brake, a failing power supply or fan): show the node's "
        "`nvidia-smi -q -d PERFORMANCE` to its administrator",
    ),
}
CLOCK, CLOCK_MAX = "sm_clock_mhz", "sm_clock_max_mhz"
UTILIZATION, TEMPERATURE = "utilization_percent", "temperature_celsius"
_MAXIMA = (*THROTTLES, UTILIZATION, TEMPERATURE)  # a process's worst GPU by these: the highest


def process_health(last_epoch: Mapping[str, Mapping[str, float]] | None) -> dict[str, list[Any]] | None:
    """A process's GPU summary of the epoch for its row: field -> [value, label of the GPU], or None without one.

    ``last_epoch`` is ``GPUHealthSource.last_epoch()``: GPU label -> field -> value.
    Per field the GPU that fares worst; the SM clock's maximum is that of the
    GPU with the slowest clock (relative to its maximum where known).
    """
    if not last_epoch:
        return None
    out: dict[str, list[Any]] = {}
    gpus = {str(label): dict(fields) for label, fields in last_epoch.items() if fields}
    for field in _MAXIMA:
        known = [(float(f[field]), label) for label, f in gpus.items() if _number(f.get(field))]
        if known:
            value, label = max(known, key=lambda t: (t[0], t[1]))
            out[field] = [round(value, 1), label]
    clocks = [(_clock_share(f), float(f[CLOCK]), label, f) for label, f in gpus.items() if _number(f.get(CLOCK))]
    if clocks:
        _, clock, label, f = min(clocks, key=lambda t: (t[0], t[2]))
        out[CLOCK] = [round(clock, 1), label]
        if _number(f.get(CLOCK_MAX)):
            out[CLOCK_MAX] = [round(float(f[CLOCK_MAX]), 1), label]
    return out or None


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _clock_share(fields: Mapping[str, float]) -> float:
    """The SM clock against its maximum where known, else in MHz (GPUs without a maximum sort after)."""
    clock, top = float(fields[CLOCK]), fields.get(CLOCK_MAX)
    return clock / float(top) if _number(top) and top else clock


@dataclasses.dataclass
class Cause:
    """A health figure of a process's GPU that stands out: ``value`` against the others' median."""

    field: str
    gpu: str
    value: float
    others_median: float
    text: str  # "process 1's GPU 1 was power-throttled 41% of the epoch (the others' 0%)"
    advice: str


def _value(row: Mapping[str, Any], field: str) -> float | None:
    h = row.get("health") or {}
    v = h.get(field)
    return float(v[0]) if isinstance(v, (list, tuple)) and v and _number(v[0]) else None


def _gpu(row: Mapping[str, Any], field: str) -> str:
    v = (row.get("health") or {}).get(field)
    return str(v[1]) if isinstance(v, (list, tuple)) and len(v) > 1 else "?"


def _load_excess(row: Mapping[str, Any]) -> float | None:
    """Utilization beyond what the process's own steps account for (points), from its epoch figures."""
    util = _value(row, UTILIZATION)
    epoch = row.get("epoch") or {}
    compute, step = epoch.get("compute_ms"), epoch.get("step_ms")
    if util is None or not _number(compute) or not _number(step) or not step:
        return None
    return util - 100.0 * min(float(compute) / float(step), 1.0)


def _others(rows: Sequence[Mapping[str, Any]], own: Mapping[str, Any], fn) -> float | None:
    known = [v for r in rows if r is not own and (v := fn(r)) is not None]
    return float(statistics.median(known)) if known else None


def has_health(row: Mapping[str, Any]) -> bool:
    """Whether the process sent its GPUs' health (a GPUUtilizationLogger runs in its fit)."""
    return bool(row.get("health"))


def health_causes(rows: Sequence[Mapping[str, Any]], process: int) -> list[Cause]:
    """The health figures of ``process``'s GPU that stand out against the other processes' (see the module docstring)."""
    own = next((r for r in rows if int(r["process"]) == process), None)
    if own is None or not has_health(own):
        return []
    who = f"process {process}'s GPU"
    out = []
    for field, (words, advice) in THROTTLES.items():
        v, med = _value(own, field), _others(rows, own, lambda r, f=field: _value(r, f))
        if v is not None and med is not None and v >= THROTTLE_AT_LEAST and v - med >= THROTTLE_POINTS:
            gpu = _gpu(own, field)
            text = f"{who} {gpu} was {words} {v:.0f}% of the epoch (the other processes' {med:.0f}%)"
            out.append(Cause(field, gpu, v, med, text, f"Process {process}: {advice}."))
    clock = _clock_cause(rows, own, who, process)
    if clock is not None:
        out.append(clock)
    v, med = _load_excess(own), _others(rows, own, _load_excess)
    util = _value(own, UTILIZATION)
    if v is not None and med is not None and util is not None and v >= LOAD_POINTS and v - med >= LOAD_POINTS:
        gpu = _gpu(own, UTILIZATION)
        text = (
            f"{who} {gpu} was busy {util:.0f}% of the time, {v:.0f} points more than its own steps account for "
            f"(the other processes' {med:.0f}): another process is using it"
        )
        advice = (
            f"Process {process}: another program runs on its GPU: `nvidia-smi` on its node lists the processes on "
            "each GPU; give the job GPUs of its own."
        )
        out.append(Cause("other_load", gpu, v, med, text, advice))
    return out


def _clock_cause(rows: Sequence[Mapping[str, Any]], own: Mapping[str, Any], who: str, process: int) -> Cause | None:
    v = _value(own, CLOCK)
    if v is None:
        return None
    gpu = _gpu(own, CLOCK)
    relative = all(_value(r, CLOCK_MAX) for r in rows if _value(r, CLOCK) is not None)
    med = _others(rows, own, lambda r: _value(r, CLOCK))
    if med is None or v - med > -CLOCK_AT_LEAST_MHZ:
        return None
    if relative:  # every GPU's maximum known: the clock as a share of its own GPU's maximum
        top = _value(own, CLOCK_MAX) or 1.0
        share = v / top
        others = _others(rows, own, lambda r: None if _value(r, CLOCK) is None else _share(r))
        if others is None or share > CLOCK_RATIO * others:
            return None
        text = (
            f"{who} {gpu} ran its SM clock at {v:.0f} MHz, {100 * share:.0f}% of its {top:.0f} MHz maximum "
            f"(the other processes' at {100 * others:.0f}% of theirs)"
        )
    else:
        if v > CLOCK_RATIO * med:
            return None
        text = f"{who} {gpu} ran its SM clock at {v:.0f} MHz (the other processes' at {med:.0f} MHz)"
    advice = (
        f"Process {process}: its GPU's SM clock runs lower than the others': compare `nvidia-smi -q -d CLOCK,PERFORMANCE` "
        "across the nodes (locked or application clocks, `nvidia-smi -rgc` resets them; a throttle reason)."
    )
    return Cause(CLOCK, gpu, v, med, text, advice)


def _share(row: Mapping[str, Any]) -> float:
    return (_value(row, CLOCK) or 0.0) / (_value(row, CLOCK_MAX) or 1.0)


def slowdown(rows: Sequence[Mapping[str, Any]], process: int, part: str = "epoch") -> str:
    """How ``process``'s steps compare with the others' in ``part`` of the rows, in words."""
    own = next((r for r in rows if int(r["process"]) == process), None)
    s = (own or {}).get(part, {}).get("step_ms")
    med = _others(rows, own or {}, lambda r: r.get(part, {}).get("step_ms") or None)
    if not s or not med:
        return ""
    if s >= (1 + SLOWER_AT_LEAST) * med:
        return (
            f"its steps were {100 * (s / med - 1):.0f}% slower ({format_milliseconds(s)} against "
            f"{format_milliseconds(med)})"
        )
    return (
        f"its steps take as long as the others' ({format_milliseconds(s)} against {format_milliseconds(med)}): "
        "under synchronous data parallelism the others wait for it in the gradient all-reduce, so the whole job "
        "runs at its GPU's pace"
    )
