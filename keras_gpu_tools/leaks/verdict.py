"""The memory verdict: whether memory grows per epoch or per fit, how fast, when it runs out, and the likely cause.

Growth is claimed by evidence, not by its size: where the rise (a Theil-Sen
slope, see ``slope``) is certain (Mann-Kendall's confidence at least
``CERTAIN``: noise gives about 0.5) and steady (where there are enough points,
the later half rises at least ``LEVELS_OFF`` times as fast as the earlier half:
a cache that fills and then holds does not). A floor (``min_growth_mib``) leaves
out rises too small to matter: a clean fit's RSS creeps by about 0.02 MiB per
epoch (Python's and the framework's own small allocations), steadily.
"""

from __future__ import annotations

import dataclasses

from keras_gpu_tools.leaks import advice
from keras_gpu_tools.leaks.fits import MIN_FITS, FitGrowth
from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import Slope
from keras_gpu_tools.leaks.track import MIN_EPOCHS, Growth
from keras_gpu_tools.runtime.units import format_bytes

GROWS, STABLE, UNKNOWN = "grows", "stable", "unknown"
RISING = 0.7  # share of positive pairwise slopes from which a rise is consistent (too few points to halve)
CERTAIN = 0.95  # confidence that the slope is above 0 from which a rise is certain
STILL_RISING = 4.0  # a later half rising at this many times the floor still grows, however fast the first half rose
LEVELS_OFF = 0.5  # a later half rising at under this share of the earlier half's rate: levelling off, bounded
SLOW_EPOCHS = 1000  # memory that lasts at least this many epochs (or fits) at the rate: "grows slowly"
TENSOR_SHARE = 0.5  # live tensors explain growth when they add at least this share of it
RETRACES_PER_EPOCH = 0.5  # new compiled functions per epoch that make a retrace per epoch


@dataclasses.dataclass
class Context:
    """What the rules need besides the rates."""

    threshold_mib: float  # the floor: growth per epoch below this is stable, however certain
    fit_threshold_mib: float  # the same per fit
    warmup_epochs: int
    last: Reading | None = None  # the latest reading (the memory now)
    host_available: float | None = None  # bytes
    device_limits: dict[int, float] = dataclasses.field(default_factory=dict)  # bytes per local device
    seconds_per_epoch: float | None = None
    epochs_left: int | None = None  # epochs this fit still has to run
    pipeline_cache: bool = False  # an in-memory tf.data cache() in the input pipeline
    allocator_note: str | None = None  # the backend's words on its allocator's cache


@dataclasses.dataclass
class LeakVerdict:
    """The verdict of a fit (and of the fits before it in this process)."""

    category: str  # "grows", "stable" or "unknown"
    message: str
    scope: str = ""  # "epochs 2-10", "fits 1-10"
    host_mib_per_epoch: float | None = None
    device_mib_per_epoch: float | None = None
    host_mib_per_fit: float | None = None
    device_mib_per_fit: float | None = None
    epochs: int = 0  # epochs after the warm-up
    fits: int = 0
    grows: list[str] = dataclasses.field(default_factory=list)  # "host per epoch", "device per fit", ...
    exhaustion: list[str] = dataclasses.field(default_factory=list)
    causes: list[str] = dataclasses.field(default_factory=list)  # advice.* keys, most likely first
    evidence: list[str] = dataclasses.field(default_factory=list)
    advice: list[str] = dataclasses.field(default_factory=list)


def steady(s: Slope, floor: float = 0.0) -> bool:
    """Whether the rise goes on (with too few points: most pairs rise).

    The later half rises as the earlier did, or still at ``STILL_RISING`` times the floor: a leak
    whose early points rose faster (the first fits' own allocations) has not levelled off while its
    later half still grows that fast; a cache that filled has a later half near zero.
    """
    if s.early is None or s.late is None or s.early <= 0:
        return s.rising >= RISING
    return s.late >= LEVELS_OFF * s.early or (floor > 0 and s.late >= STILL_RISING * floor)


def grows(s: Slope | None, floor: float) -> bool:
    """Whether ``s`` is growth: a certain, steady rise, at least ``floor`` per unit."""
    return s is not None and s.per_unit > 0 and s.per_unit >= floor and s.confidence >= CERTAIN and steady(s, floor)


def _rate(s: Slope | None) -> float | None:
    return None if s is None else round(s.per_unit, 3)


def judge(g: Growth, fg: FitGrowth, ctx: Context) -> LeakVerdict:
    """The verdict from one fit's growth ``g``, the process's fits ``fg`` and the context."""
    t = ctx.threshold_mib
    v = LeakVerdict(
        UNKNOWN,
        "",
        host_mib_per_epoch=_rate(g.host),
        device_mib_per_epoch=_rate(g.device),
        host_mib_per_fit=_rate(fg.host),
        device_mib_per_fit=_rate(fg.device),
        epochs=g.epochs,
        fits=fg.fits,
    )
    first = ctx.warmup_epochs + 1
    epoch_scope = f"epochs {first}-{ctx.warmup_epochs + g.epochs}" if g.epochs else ""
    fit_scope = f"fits 1-{fg.fits}" if fg.host is not None or fg.device is not None else ""
    v.scope = ", ".join(s for s in (epoch_scope if g.host or g.device else "", fit_scope) if s)
    for name, s, limit in (
        ("host per epoch", g.host, t),
        ("device per epoch", g.device, t),
        ("host per fit", fg.host, ctx.fit_threshold_mib),
        ("device per fit", fg.device, ctx.fit_threshold_mib),
    ):
        if grows(s, limit) and s is not None:
            v.grows.append(name)
            halves = (
                ""
                if s.early is None or s.late is None
                else f"; {_mib(s.early)} then {_mib(s.late)} MiB per {name.split()[-1]} over its two halves"
            )
            v.evidence.append(
                f"The {name} rise is certain and steady: confidence {s.confidence:.3f} that it rises, "
                f"{s.rising:.0%} of the pairs of points rise{halves}."
            )
    measured = any(s is not None for s in (g.host, g.device, fg.host, fg.device))
    v.category = GROWS if v.grows else STABLE if measured else UNKNOWN
    _causes(v, g, fg, ctx)
    _exhaustion(v, g, fg, ctx)
    v.message = _message(v, g, fg, ctx, epoch_scope)
    v.advice = [advice.FIXES[c] for c in v.causes]
    return v


def _causes(v: LeakVerdict, g: Growth, fg: FitGrowth, ctx: Context) -> None:
    per_epoch = [s.per_unit for s in (g.host, g.device) if grows(s, ctx.threshold_mib) and s is not None]
    per_fit = any(w.endswith("per fit") for w in v.grows)
    if fg.uncleared:
        named = f" (about {fg.named_per_fit} objects each time)" if fg.named_per_fit else ""
        v.evidence.append(
            f"{fg.uncleared} of the {fg.fits - 1} later fits trained a new model built without "
            f"`keras.backend.clear_session()`: Keras's global name counters kept growing{named}."
        )
    if per_fit and fg.uncleared and fg.uncleared * 2 >= max(fg.new_models, 1):
        v.causes.append(advice.CLEAR_SESSION)
    elif per_fit and fg.cleared * 2 >= max(fg.fits - 1, 1):
        v.evidence.append(f"Keras's session was cleared before {fg.cleared} of the {fg.fits - 1} later fits.")
        v.causes.append(advice.FRAMEWORK_PER_FIT)
    if per_epoch and g.tensor_mib is not None:
        # Bytes decide, not the count: the tensors a fit frees between two counts can hide the ones kept.
        share = g.tensor_mib.per_unit / max(per_epoch)
        count = "" if g.tensors is None else f" ({g.tensors.per_unit:+.2g} tensors per epoch)"
        v.evidence.append(
            f"The framework's live tensors grow by {g.tensor_mib.per_unit:.1f} MiB per epoch{count}: "
            f"{share:.0%} of the growth."
        )
        if g.tensor_mib.per_unit > 0 and share >= TENSOR_SHARE:
            v.causes.append(advice.TENSORS_KEPT)
    if g.compiled is not None and g.compiled.per_unit >= RETRACES_PER_EPOCH:
        v.evidence.append(f"The model's compiled functions grow by {g.compiled.per_unit:.1f} per epoch.")
        if per_epoch:
            v.causes.append(advice.RETRACE)
    host_grows = grows(g.host, ctx.threshold_mib)
    if host_grows and ctx.pipeline_cache and advice.TENSORS_KEPT not in v.causes:
        v.causes.append(advice.DATA_CACHE)
    if grows(g.reserved, ctx.threshold_mib) and not grows(g.device, ctx.threshold_mib) and g.reserved is not None:
        in_use = "" if g.device is None else f" while what tensors use changes by {g.device.per_unit:+.1f} MiB"
        note = f" {ctx.allocator_note}" if ctx.allocator_note else ""
        v.evidence.append(
            f"The device memory the allocator holds grows by {g.reserved.per_unit:.1f} MiB per epoch{in_use}: "
            f"the allocator's cache, not a leak.{note}"
        )
        v.causes.append(advice.ALLOCATOR_CACHE)
    if v.category == GROWS and not [c for c in v.causes if c != advice.ALLOCATOR_CACHE]:
        v.causes.append(advice.UNKNOWN)
    if g.warmup_host_mib is not None and ctx.warmup_epochs:
        dev = "" if g.warmup_device_mib is None else f", device {g.warmup_device_mib:+.1f} MiB"
        v.evidence.append(
            f"The warm-up (epoch{'s 1-' if ctx.warmup_epochs > 1 else ' '}{ctx.warmup_epochs}: compiled programs, "
            f"optimizer slots, caches filling) added host {g.warmup_host_mib:+.1f} MiB{dev}; it is not counted as growth."
        )


def duration(seconds: float) -> str:
    """``45 s``, ``13 min``, ``2.1 h``, ``3.2 days``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _runs_out(free: float, per_unit_mib: float, unit: str, seconds: float | None) -> str:
    n = free / (per_unit_mib * MIB)
    when = f"about {n:,.0f} {unit}s" if n >= 1 else f"less than one {unit}"
    if seconds and unit == "epoch":
        when += f" (about {duration(n * seconds)} at {seconds:.3g} s an epoch)"
    return when


def _exhaustion(v: LeakVerdict, g: Growth, fg: FitGrowth, ctx: Context) -> None:
    t, last = ctx.threshold_mib, ctx.last
    if grows(g.host, t) and g.host is not None and ctx.host_available:
        when = _runs_out(ctx.host_available, g.host.per_unit, "epoch", ctx.seconds_per_epoch)
        v.exhaustion.append(
            f"At this rate the host's available memory ({format_bytes(ctx.host_available)}) runs out in {when}."
        )
        if ctx.epochs_left:
            v.exhaustion.append(
                f"The {ctx.epochs_left} epochs left in this fit would add {g.host.per_unit * ctx.epochs_left:,.0f} MiB."
            )
    if last is not None:
        for i, s in sorted(g.devices.items()):
            limit = ctx.device_limits.get(i)
            if grows(s, t) and limit and i in last.in_use:
                free = max(limit - last.in_use[i], 0.0)
                when = _runs_out(free, s.per_unit, "epoch", ctx.seconds_per_epoch)
                v.exhaustion.append(
                    f"At this rate device {i}'s free memory ({format_bytes(free)} of {format_bytes(limit)}) "
                    f"runs out in {when}."
                )
    if grows(fg.host, ctx.fit_threshold_mib) and fg.host is not None and ctx.host_available:
        when = _runs_out(ctx.host_available, fg.host.per_unit, "fit", None)
        v.exhaustion.append(f"The host's available memory ({format_bytes(ctx.host_available)}) lasts {when} more.")


def _mib(x: float) -> str:
    """A rate in MiB: one decimal from 1 up, two significant digits under it (0.52, 0.031)."""
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.2g}"


def _lasts(what: str, per_unit_mib: float, g: Growth, ctx: Context) -> float | None:
    """How many units (epochs, fits) the host's or the devices' free memory lasts at this rate (None: unknown)."""
    if per_unit_mib <= 0:
        return None
    if what == "Host":
        return ctx.host_available / (per_unit_mib * MIB) if ctx.host_available else None
    last = ctx.last
    if last is None or not ctx.device_limits:
        return None
    free = sum(max(limit - last.in_use.get(i, 0.0), 0.0) for i, limit in ctx.device_limits.items())
    return free / (per_unit_mib * MIB)


def _message(v: LeakVerdict, g: Growth, fg: FitGrowth, ctx: Context, epoch_scope: str) -> str:
    t = ctx.threshold_mib
    parts = []
    for what, s in (("host", g.host), ("device", g.device)):
        if s is not None:
            parts.append(f"{what} {s.per_unit:+.1f} MiB per epoch")
    fit_parts = [f"{w} {s.per_unit:+.1f} MiB per fit" for w, s in (("host", fg.host), ("device", fg.device)) if s]
    epochs = f" over {epoch_scope}" if parts else ""
    fits = f" over the {fg.fits} fits of this process" if fit_parts else ""
    if v.category == UNKNOWN:
        need = MIN_EPOCHS - g.epochs
        text = (
            f"No growth rate yet: {g.epochs} epoch(s) after the warm-up of {ctx.warmup_epochs} "
            f"({MIN_EPOCHS} needed, {need} more)"
        )
        if fg.fits > 1:
            text += f"; {fg.fits} fits in this process ({MIN_FITS + 1} needed for a rate per fit)"
        return text + "."
    if v.category == STABLE:
        text = "Memory is stable: " + "; ".join(
            p
            for p in (", ".join(parts) + epochs if parts else "", ", ".join(fit_parts) + fits if fit_parts else "")
            if p
        )
        text += (
            " (stable: no certain rise, a rise that levels off, as a cache filling, or under "
            f"{t:g} MiB per epoch and {ctx.fit_threshold_mib:g} MiB per fit)."
        )
        if advice.ALLOCATOR_CACHE in v.causes:
            text += " The allocator's reserved memory grows, but that is its cache, not a leak."
        return text
    growing, said_lasts = [], False
    ft = ctx.fit_threshold_mib
    for what, s, unit, limit in (
        ("Host", g.host, "epoch", t),
        ("Device", g.device, "epoch", t),
        ("Host", fg.host, "fit", ft),
        ("Device", fg.device, "fit", ft),
    ):
        if grows(s, limit) and s is not None:
            lasts = _lasts(what, s.per_unit, g, ctx)
            if lasts is not None and lasts >= SLOW_EPOCHS:
                said_lasts = True
                growing.append(
                    f"{what} memory grows slowly: {_mib(s.per_unit)} MiB per {unit}, "
                    f"{what.lower()} memory lasts {lasts:,.0f} {unit}s at that rate"
                )
            else:
                growing.append(f"{what} memory grows by {_mib(s.per_unit)} MiB per {unit}")
    where = (
        " (" + ", ".join(s for s in (epoch_scope if parts else "", f"{fg.fits} fits" if fit_parts else "") if s) + ")"
    )
    text = "; ".join(growing) + where + "."
    likely = [advice.TITLES[c] for c in v.causes if c not in (advice.UNKNOWN, advice.ALLOCATOR_CACHE)]
    if likely:
        text += " Likely cause: " + "; ".join(likely) + "."
    if v.exhaustion and not said_lasts:  # said once: "lasts N epochs" already gives the figure
        text += " " + v.exhaustion[0]
    return text
