"""GPU health: per GPU, only what deserves attention; the energy; what a GPU cannot report.

It reads each GPU's figures per epoch (`ReportData.gpu_epochs`: the logger's epoch
figures, from its ``epoch_history`` or, in a log directory, its ``gpu_epoch/...`` tags) and names
what deserves attention, by these rules:

- a clock-event (throttle) reason active at least ``THROTTLE_ATTENTION`` (5%)
  of the time over the epochs (the mean of its epochs' shares): which, for how
  long, in which epochs;
- the SM (or memory) clock under ``CLOCK_BELOW`` (90%) of its maximum in the
  epochs under load (utilization at least ``UNDER_LOAD`` 50%, or every epoch
  where utilization is not known);
- uncorrected ECC errors (any), corrected ECC errors that rose during the run,
  XID events (any);
- a temperature of ``HOT_CELSIUS`` (85 deg C) or more in an epoch, where GPUs
  begin to slow down;
- power at its limit: an epoch's mean power at least ``POWER_AT_LIMIT`` (95%)
  of the enforced limit.

Energy per epoch and joules per sample are figures, not alarms. The fields a
GPU or driver could not report are listed with the reason the logger gave.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.series import Series
from keras_gpu_tools.reporting import drawing
from keras_gpu_tools.reporting.logs import UNSUPPORTED_DATA, Logs
from keras_gpu_tools.reporting.markup import bullets, e, img, prose
from keras_gpu_tools.reporting.model import ReportData, extend
from keras_gpu_tools.reporting.section import Badge, BaseSection, TextSection
from keras_gpu_tools.reporting.sources import gpu_logger, input_detector, name_of
from keras_gpu_tools.reporting.values import finite
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS, THROTTLE_REASONS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

THROTTLE_ATTENTION = 5.0  # % of the time
CLOCK_BELOW = 0.90
UNDER_LOAD = 50.0  # utilization, %
HOT_CELSIUS = 85.0
POWER_AT_LIMIT = 0.95

# What each throttle reason did, in words.
THROTTLE_WORDS = {
    "throttle_power_percent": "the power cap held the clocks down",
    "throttle_thermal_percent": "thermal slowdown held the clocks down",
    "throttle_hw_slowdown_percent": "hardware slowdown (power brake or slowdown signal) held the clocks down",
    "throttle_sync_boost_percent": "sync boost held the clocks to the slowest GPU of its group",
    "throttle_app_clocks_percent": "the application clocks setting capped the clocks",
}
NOTHING = "Nothing in the GPUs' health deserves attention"


@dataclasses.dataclass
class GPUHealth:
    """One GPU's health over the run: what deserves attention, its energy (figures), its unsupported fields."""

    label: str
    epochs: int
    attention: list[str]
    energy: list[str]
    unsupported: dict[str, str]


def has_health(data: ReportData) -> bool:
    """Whether the run has health figures or a record of unsupported fields (else no section)."""
    return bool(data.gpu_unsupported) or any(_field_of(k) in HEALTH_FIELDS for k in data.gpu_epochs)


def _field_of(key: str) -> str:
    m = schema.GPU_KEY_RE.match(key)
    return m.group(2) if m else ""


def values(data: ReportData, label: str, field: str) -> list[float | None]:
    """A GPU's figure per epoch (None: not reported that epoch)."""
    return list(data.gpu_epochs.get(schema.gpu_key(label, field)) or [])


def labels(data: ReportData) -> list[str]:
    """The GPUs with health figures or unsupported fields, in the report's order."""
    seen = {m.group(1) for k in data.gpu_epochs if (m := schema.GPU_KEY_RE.match(k)) and m.group(2) in HEALTH_FIELDS}
    seen |= set(data.gpu_unsupported)
    return sorted(seen, key=lambda s: (len(s), s))


def gpu_health(data: ReportData) -> list[GPUHealth]:
    """Each GPU's health, by the rules of the module docstring."""
    out = []
    for label in labels(data):
        n = max((len(v) for k, v in data.gpu_epochs.items() if k.startswith(schema.gpu_key(label, ""))), default=0)
        out.append(
            GPUHealth(
                label,
                n,
                _throttles(data, label) + _clocks(data, label) + _errors(data, label) + _heat_and_power(data, label),
                _energy(data, label),
                dict(data.gpu_unsupported.get(label, {})),
            )
        )
    return out


def summary_line(gpus: Sequence[GPUHealth]) -> str:
    """The section's one line where nothing deserves attention."""
    n = max((g.epochs for g in gpus), default=0)
    if not n:  # only the record of unsupported fields: logs written before the per-epoch figures, or no epoch ended
        return "No GPU health figures per epoch in these logs (an earlier version's, or no epoch ended)."
    return (
        f"{NOTHING}: no throttling, clocks at their maximum under load, no ECC or XID errors, temperature and power "
        f"within limits ({len(gpus)} GPU{'' if len(gpus) == 1 else 's'}, {n} epoch{'' if n == 1 else 's'})."
    )


def epochs_text(indices: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` (0-based) as "epochs 2-4, 6"."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(_run(run))
        run = [i]
    if run:
        parts.append(_run(run))
    return ("epoch " if len(indices) == 1 else "epochs ") + ", ".join(parts)


def _run(run: list[int]) -> str:
    return f"{run[0] + 1}" if len(run) == 1 else f"{run[0] + 1}-{run[-1] + 1}"


def _known(vs: Sequence[float | None]) -> list[tuple[int, float]]:
    return [(i, float(v)) for i, v in enumerate(vs) if v is not None]


def _throttles(data: ReportData, label: str) -> list[str]:
    out = []
    for field in THROTTLE_REASONS:
        known = _known(values(data, label, field))
        if not known:
            continue
        mean = sum(v for _, v in known) / len(known)
        if mean < THROTTLE_ATTENTION:
            continue
        top, at = max((v, i) for i, v in known)
        where = epochs_text([i for i, v in known if v >= THROTTLE_ATTENTION])
        out.append(
            f"{THROTTLE_WORDS[field]} {mean:.0f}% of the time over {len(known)} epochs "
            f"({where}; at most {top:.0f}% in epoch {at + 1})."
        )
    return out


def _clocks(data: ReportData, label: str) -> list[str]:
    util = values(data, label, "utilization_percent")
    out = []
    for name, field, top_field in (
        ("SM clock", "sm_clock_mhz", "sm_clock_max_mhz"),
        ("memory clock", "memory_clock_mhz", "memory_clock_max_mhz"),
    ):
        clocks, tops = values(data, label, field), [v for _, v in _known(values(data, label, top_field))]
        if not tops:
            continue
        top = max(tops)
        loaded = [
            (i, v) for i, v in _known(clocks) if i >= len(util) or util[i] is None or (util[i] or 0.0) >= UNDER_LOAD
        ]
        if not loaded or not top:
            continue
        mean = sum(v for _, v in loaded) / len(loaded)
        low = [i for i, v in loaded if v < CLOCK_BELOW * top]
        if mean < CLOCK_BELOW * top:
            out.append(
                f"the {name} ran at {mean:.0f} MHz under load, {100 * mean / top:.0f}% of its {top:.0f} MHz maximum "
                f"(below {100 * CLOCK_BELOW:.0f}% in {epochs_text(low)})."
            )
    return out


def _errors(data: ReportData, label: str) -> list[str]:
    out = []
    unc = _known(values(data, label, "ecc_uncorrected_errors"))
    if unc and max(v for _, v in unc) > 0:
        out.append(
            f"{max(v for _, v in unc):.0f} uncorrected ECC error(s) since the driver loaded: the GPU's memory "
            "lost data; report the GPU to its administrator (`nvidia-smi -q -d ECC`)."
        )
    cor = _known(values(data, label, "ecc_corrected_errors"))
    if cor and cor[-1][1] > cor[0][1]:
        out.append(
            f"corrected ECC errors rose from {cor[0][1]:.0f} to {cor[-1][1]:.0f} during the run: memory cells are "
            "wearing out; watch `nvidia-smi -q -d ECC`."
        )
    xid = _known(values(data, label, "xid_events"))
    if xid and sum(v for _, v in xid) > 0:
        out.append(
            f"{sum(v for _, v in xid):.0f} XID error event(s) in {epochs_text([i for i, v in xid if v > 0])}: "
            "the driver reported a GPU error (the logger warned with its code; the kernel log has the details)."
        )
    return out


def _heat_and_power(data: ReportData, label: str) -> list[str]:
    out = []
    temps = _known(values(data, label, "temperature_celsius_max")) or _known(values(data, label, "temperature_celsius"))
    hot = [(i, v) for i, v in temps if v >= HOT_CELSIUS]
    if hot:
        top, at = max((v, i) for i, v in hot)
        more = f"; {HOT_CELSIUS:.0f} deg C or more in {epochs_text([i for i, _ in hot])}" if len(hot) > 1 else ""
        out.append(f"the temperature reached {top:.0f} deg C (epoch {at + 1}{more}), where GPUs begin to slow down.")
    power, limits = values(data, label, "power_watts"), values(data, label, "power_limit_watts")
    at_limit = [
        (i, p, limits[i])
        for i, p in _known(power)
        if i < len(limits) and limits[i] and p >= POWER_AT_LIMIT * (limits[i] or 0.0)
    ]
    if at_limit:
        mean = sum(p for _, p, _ in at_limit) / len(at_limit)
        limit = max(lim or 0.0 for _, _, lim in at_limit)
        out.append(
            f"power at its limit: {mean:.0f} W of {limit:.0f} W on average in {epochs_text([i for i, _, _ in at_limit])}."
        )
    return out


def _energy(data: ReportData, label: str) -> list[str]:
    joules = _known(values(data, label, "energy_joules"))
    if not joules:
        return []
    total = sum(v for _, v in joules)
    return [
        f"{_joules(total / len(joules))} per epoch, {_joules(total)} over {len(joules)} "
        f"epoch{'' if len(joules) == 1 else 's'}"
    ]


HEADING = "GPU health"
ENERGY = "Energy (a figure, not a finding):"
UNSUPPORTED = "Not reported by the GPU or its driver (left out, never counted as 0):"


def energy_lines(data: ReportData, gpus: Sequence[GPUHealth]) -> list[str]:
    """The energy figures, a line each: per GPU, and per training sample."""
    lines = [f"GPU {g.label}: {e}." for g in gpus for e in g.energy]
    per_sample = joules_per_sample(data)
    return lines + ([per_sample] if per_sample else [])


def unsupported_lines(gpus: Sequence[GPUHealth]) -> list[str]:
    """The fields each GPU could not report, with the reason, a line per GPU."""
    return [
        f"GPU {g.label}: " + "; ".join(f"{field} ({why})" for field, why in sorted(g.unsupported.items()))
        for g in gpus
        if g.unsupported
    ]


def joules_per_sample(data: ReportData) -> str:
    """The run's energy per training sample, as of its last epoch ("" where not logged)."""
    known = _known(data.gpu_epochs.get(schema.JOULES_PER_SAMPLE) or [])
    if not known:
        return ""
    return f"Energy per training sample: {_joules(known[-1][1])} (the last figure logged)."


def _joules(j: float) -> str:
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ")):
        if j >= scale:
            return f"{j / scale:.2f} {unit}"
    return f"{j:.3g} J"


def from_series(series: dict[str, Series]) -> dict[str, list[float | None]]:
    """Each GPU's figures per epoch, from the logger's per-epoch series of a log directory.

    The logger writes each GPU's epoch figures (the values History gets) once an epoch, at its
    last step, as ``gpu_epoch/<label>/<field>``; they are taken as they are, as
    ``gpu/<label>/<field>`` (the keys of History), never re-averaged from the sampled series. A
    GPU's epochs are the steps of its epoch figures (None: a field it did not report that epoch).
    Logs written before these tags give nothing: no per-epoch GPU figures.
    """
    by_label: dict[str, dict[str, Series]] = {}
    for key, s in series.items():
        m = schema.GPU_EPOCH_KEY_RE.match(key)
        if m:
            by_label.setdefault(m.group(1), {})[m.group(2)] = s
    out: dict[str, list[float | None]] = {}
    for label, fields in by_label.items():
        ends = sorted({step for s in fields.values() for step in s.steps})
        at = {step: i for i, step in enumerate(ends)}
        for field, s in fields.items():
            per_epoch: list[float | None] = [None] * len(ends)
            for step, value in zip(s.steps, s.values):
                per_epoch[at[step]] = value if math.isfinite(value) else None
            out[schema.gpu_key(label, field)] = per_epoch
    return out


class GPUHealthSection(BaseSection):
    name = "gpu_health"

    def from_callbacks(self, data: ReportData, source: Any) -> str | None:
        lg = gpu_logger(source)
        if lg is not None:
            history = list(lg.epoch_history)
            keys = {k for h in history for k in h if k.startswith(schema.GPU_PREFIX) or k == schema.JOULES_PER_SAMPLE}
            if schema.JOULES_PER_SAMPLE in data.gpu_epochs:  # another callback's already
                keys.discard(schema.JOULES_PER_SAMPLE)
            for key in keys:
                data.gpu_epochs[key] = [finite(h.get(key)) for h in history]
            unsupported = getattr(lg, "unsupported_fields", None)
            for label, fields in (unsupported if isinstance(unsupported, dict) else {}).items():
                data.gpu_unsupported.setdefault(str(label), {}).update({str(f): str(r) for f, r in fields.items()})
            return name_of(lg)
        det = input_detector(source)
        if det is not None:
            history = list(det.epoch_history)
            if any(schema.JOULES_PER_SAMPLE in h for h in history) and schema.JOULES_PER_SAMPLE not in data.gpu_epochs:
                data.gpu_epochs[schema.JOULES_PER_SAMPLE] = [finite(h.get(schema.JOULES_PER_SAMPLE)) for h in history]
            return name_of(det)
        return None

    def from_logdir(self, data: ReportData, logs: Logs) -> None:
        epochs: dict[str, Series] = {}  # the logger's `gpu_epoch/...` figures, of every process
        joules = Series(schema.JOULES_PER_SAMPLE)
        for _run, tag, points in logs.scalars():  # (another process's runs hold only its GPUs')
            if tag.startswith(schema.GPU_EPOCH_PREFIX):
                extend(epochs, tag, points)
            elif tag == schema.JOULES_PER_SAMPLE:  # the logger's, per epoch
                joules.merge(points)
        for _run, value in logs.every(UNSUPPORTED_DATA):  # every process's GPUs, the last fit's last
            if isinstance(value, dict):
                for label, fields in value.items():
                    if isinstance(fields, dict):
                        data.gpu_unsupported.setdefault(str(label), {}).update(
                            {str(f): str(r) for f, r in fields.items()}
                        )
        data.gpu_epochs = from_series(epochs)
        if joules.values:  # one point per epoch
            data.gpu_epochs[schema.JOULES_PER_SAMPLE] = list(joules.values)

    def fill(self, data: ReportData, other: ReportData) -> None:
        if not data.gpu_epochs:
            data.gpu_epochs = other.gpu_epochs
        if not data.gpu_unsupported:
            data.gpu_unsupported = other.gpu_unsupported

    def text(self, data: ReportData) -> TextSection | None:
        """Only what deserves attention, per GPU (one line where nothing does); the energy; the fields not reported."""
        if not has_health(data):
            return None
        gpus = gpu_health(data)
        flagged = [g for g in gpus if g.attention]
        body = [] if flagged else [summary_line(gpus)]
        for g in flagged:
            body += [f"GPU {g.label}:"] + [f"- {a}" for a in g.attention]
        energy, unsupported = energy_lines(data, gpus), unsupported_lines(gpus)
        if energy:
            body += [ENERGY] + [f"- {line}" for line in energy]
        if unsupported:
            body += [UNSUPPORTED] + [f"- {line}" for line in unsupported]
        return HEADING, body

    def html(self, data: ReportData, pngs: dict[str, bytes]) -> list[str]:
        if not has_health(data):
            return []
        gpus = gpu_health(data)
        flagged = [g for g in gpus if g.attention]
        parts = [f"<h3>{HEADING}</h3>"]
        if not flagged:
            parts.append(f'<p class="kgt-health-ok">{prose(summary_line(gpus))}</p>')
        for g in flagged:
            parts.append(f'<p class="kgt-health">GPU {e(g.label)}:</p>' + bullets(g.attention))
            parts.append(
                img(pngs, f"health_{g.label}", f"GPU {g.label} throttle reasons, SM clock and power per epoch")
            )
        energy, unsupported = energy_lines(data, gpus), unsupported_lines(gpus)
        if energy:
            parts.append(f"<p>{e(ENERGY)}</p>" + bullets(energy))
        if unsupported:
            parts.append(f"<p>{e(UNSUPPORTED)}</p>" + bullets(unsupported))
        return parts

    def figures(self, data: ReportData) -> dict[str, Figure]:
        if not has_health(data):
            return {}
        # the GPUs whose health deserves attention
        return {
            f"health_{g.label}": _health_figure(data, g.label) for g in gpu_health(data) if g.attention and g.epochs
        }

    def badges(self, data: ReportData) -> list[Badge]:
        if not has_health(data):
            return []
        n = sum(len(g.attention) for g in gpu_health(data))
        return [(f"GPU health: {n} finding(s)", "warn") if n else ("GPU health: nothing to note", "ok")]


def _health_figure(data: ReportData, label: str) -> Figure:
    """A GPU's health per epoch: the share of time of each throttle reason, the SM clock against its maximum, power."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax_t, ax_c, ax_p) = drawing.new_figure(3, height=1.9)
    name = next((g["name"] for g in data.gpus if g.get("index") == label), "")
    fig.suptitle(f"GPU {label} health" + (f": {name}" if name else ""), fontsize=11)

    def plot(ax: Axes, field: str, style: str = "-", **kw) -> bool:
        ys = values(data, label, field)
        xs = [i + 1 for i, v in enumerate(ys) if v is not None]
        if xs:
            ax.plot(xs, [v for v in ys if v is not None], style, marker="o", markersize=3, label=field, **kw)
        return bool(xs)

    for field in THROTTLE_WORDS:
        if any(values(data, label, field)):  # a reason never active is left out of the legend
            plot(ax_t, field)
    ax_t.set_ylim(0, 105)
    ax_t.set_ylabel("% of the time")
    ax_t.set_title("throttle reasons active", fontsize=9, loc="left")
    for ax, fields, unit, title in (
        (ax_c, ("sm_clock_mhz", "sm_clock_max_mhz"), "MHz", "SM clock against its maximum"),
        (ax_p, ("power_watts", "power_limit_watts"), "W", "power against its limit"),
    ):
        shown = [plot(ax, f, "--" if i else "-", linewidth=1.0 if i else 1.4) for i, f in enumerate(fields)]
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=9, loc="left")
        if any(shown):
            drawing.legend_right(ax)
    if ax_t.lines:
        drawing.legend_right(ax_t)
    for ax in (ax_t, ax_c, ax_p):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_p.set_xlabel("epoch")
    return fig


SECTION = GPUHealthSection()
