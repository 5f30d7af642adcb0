"""One fit's memory per epoch, and its growth per epoch after the warm-up.

The growth of each figure is a Theil-Sen slope over the reading that ends the
warm-up (the fit's start where there is none) and the readings of the epochs
after it; it is claimed from ``MIN_EPOCHS`` such epochs on, never before: the
first epoch's allocations (compiled programs, the optimizer's slots, caches
filling) are not growth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import Slope, evenly, theil_sen, with_halves

MIN_EPOCHS = 3  # epochs after the warm-up before a growth rate is claimed


@dataclasses.dataclass
class Census:
    """Live tensors counted by a walk over the heap at one epoch's end (-1: before the first epoch ended)."""

    epoch: int
    count: int
    nbytes: float


@dataclasses.dataclass
class Growth:
    """The growth rates of one fit (MiB per epoch, counts per epoch); None where not claimed or not read."""

    epochs: int  # epochs after the warm-up
    host: Slope | None = None
    device: Slope | None = None
    devices: dict[int, Slope] = dataclasses.field(default_factory=dict)
    reserved: Slope | None = None
    tensors: Slope | None = None  # count per epoch
    tensor_mib: Slope | None = None
    compiled: Slope | None = None
    warmup_host_mib: float | None = None  # what the warm-up added (left out of the rates)
    warmup_device_mib: float | None = None


class EpochTrack:
    """The readings of one fit: at its start and at each epoch's end."""

    def __init__(self, warmup_epochs: int, start: Reading):
        self.warmup_epochs = warmup_epochs
        self.start = start
        self.readings: list[Reading] = []
        self.censuses: list[Census] = []

    def add(self, reading: Reading) -> None:
        self.readings.append(reading)

    @property
    def baseline(self) -> Reading:
        """The reading that ends the warm-up (the fit's start without one)."""
        w = self.warmup_epochs
        return self.readings[w - 1] if w and len(self.readings) >= w else self.start

    def points(self) -> list[Reading]:
        """The baseline and the epochs after the warm-up, thinned to ``MAX_POINTS`` evenly spaced ones.

        Thinned before any figure is read, so that an epoch's work stays the same however long the fit.
        """
        w = self.warmup_epochs
        if len(self.readings) < w:
            return []
        n = 1 + len(self.readings) - w
        return [self.baseline if i == 0 else self.readings[w + i - 1] for i in evenly(n)]

    def seconds_per_epoch(self) -> float | None:
        """The mean wall time of an epoch after the warm-up (None before two readings)."""
        pts = self.points()
        if len(pts) < 2 or pts[-1].epoch == pts[0].epoch:
            return None
        return (pts[-1].wall - pts[0].wall) / (pts[-1].epoch - pts[0].epoch)

    def growth(self, brief: bool = False, halves: bool = True) -> Growth:
        """The growth rates; ``brief``: those of the host and of the devices together only (an epoch end's figures).

        ``halves=False`` leaves out the slopes of the earlier and later halves
        (``Slope.early``, ``late``): the rates alone, a third of the work. Reads
        at most ``MAX_POINTS`` readings, however many epochs the fit has had.
        """
        epochs = max(len(self.readings) - self.warmup_epochs, 0)  # (counted: a slice would copy every reading)
        g = Growth(epochs=epochs)
        if self.readings and self.warmup_epochs:
            g.warmup_host_mib = _delta(self.start.host_rss, self.baseline.host_rss)
            g.warmup_device_mib = _delta(self.start.device_in_use, self.baseline.device_in_use)
        if epochs < MIN_EPOCHS:
            return g
        pts = self.points()
        g.host, g.device = _host_and_device(pts, halves)
        if brief:
            return g
        for i in pts[-1].in_use:
            s = _slope(pts, _device(i), MIB)
            if s is not None:
                g.devices[i] = s
        g.reserved = _slope(pts, lambda r: r.device_reserved, MIB)
        g.tensors = _slope(pts, lambda r: r.tensors[0] if r.tensors else None, 1.0)
        g.tensor_mib = _slope(pts, lambda r: r.tensors[1] if r.tensors else None, MIB)
        if g.tensors is None and len(self.censuses) >= 2:  # a heap walk at two epochs: the rate between them
            a, b = self.censuses[0], self.censuses[-1]
            if b.epoch > a.epoch:
                n = b.epoch - a.epoch
                g.tensors = Slope((b.count - a.count) / n, 1.0 if b.count > a.count else 0.0, 2)
                g.tensor_mib = Slope((b.nbytes - a.nbytes) / n / MIB, 1.0 if b.nbytes > a.nbytes else 0.0, 2)
        g.compiled = _slope(pts, lambda r: r.compiled, 1.0)
        return g

    def with_halves(self, g: Growth) -> Growth:
        """``g``, made by ``growth(brief=True, halves=False)`` of the same readings, as ``growth(brief=True)`` makes it."""
        pts = self.points()
        for name, value in (("host", _host), ("device", _device_total)):
            s = getattr(g, name)
            if s is not None:
                setattr(g, name, with_halves(s, *_series(pts, value, MIB)))
        return g


def _host(r: Reading) -> float | None:
    return r.host_rss


def _device_total(r: Reading) -> float | None:
    return r.device_in_use


def _device(index: int) -> Callable[[Reading], float | None]:
    return lambda r: r.in_use.get(index)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) / MIB


def _series(
    points: list[Reading], value: Callable[[Reading], float | None], unit: float
) -> tuple[list[float], list[float]]:
    """(epochs, values in ``unit``) of the points where ``value`` is known."""
    xs, ys = [], []
    for r in points:
        v = value(r)
        if v is not None:
            xs.append(float(r.epoch))
            ys.append(float(v) / unit)
    return xs, ys


def _host_and_device(points: list[Reading], halves: bool) -> tuple[Slope | None, Slope | None]:
    """``_slope`` of the host's and of the devices' bytes, their series read in one pass over the points."""
    hx: list[float] = []
    hy: list[float] = []
    dx: list[float] = []
    dy: list[float] = []
    for r in points:
        if r.host_rss is not None:
            hx.append(float(r.epoch))
            hy.append(float(r.host_rss) / MIB)
        if r.in_use:
            dx.append(float(r.epoch))
            dy.append(float(sum(r.in_use.values())) / MIB)  # (``device_in_use``)
    host = theil_sen(hx, hy, halves) if len(hx) >= MIN_EPOCHS else None
    return host, (theil_sen(dx, dy, halves) if len(dx) >= MIN_EPOCHS else None)


def _slope(
    points: list[Reading], value: Callable[[Reading], float | None], unit: float, halves: bool = True
) -> Slope | None:
    """The slope of ``value`` over the points where it is known, in ``unit`` per epoch (at least MIN_EPOCHS of them)."""
    xs, ys = _series(points, value, unit)
    if len(xs) < MIN_EPOCHS:
        return None
    return theil_sen(xs, ys, halves)
