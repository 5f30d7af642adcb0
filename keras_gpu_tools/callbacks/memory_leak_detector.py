"""MemoryLeakDetector: whether memory grows with each epoch or each fit(), how fast, and the likely cause."""

from __future__ import annotations

import os
import time
from typing import Any

from keras_gpu_tools.backends.base import FUNCTIONS
from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.errors import MemoryLeakWarning
from keras_gpu_tools.leaks import host
from keras_gpu_tools.leaks.fits import PROCESS, FitRecord
from keras_gpu_tools.leaks.readings import Reading
from keras_gpu_tools.leaks.summary import epoch_line, fit_lines, summary_text, write_epoch, write_fit
from keras_gpu_tools.leaks.traces import TraceReader
from keras_gpu_tools.leaks.track import MIN_EPOCHS, Census, EpochTrack, Growth
from keras_gpu_tools.leaks.verdict import CERTAIN, Context, LeakVerdict, grows, judge
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import validation as check
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.warn_once import WarnOnce


class MemoryLeakDetector(FitCallback):
    """Tells whether memory grows with each epoch or each `fit()`, how fast, and why.

    At each epoch's end it reads this process's resident memory (host RSS),
    the framework allocator's bytes in use on every GPU, the live tensors of
    the framework (where that is cheap: `jax.live_arrays()`) and the traces of
    the model's compiled functions. Their growth per epoch is a robust slope
    (Theil-Sen: the median of the pairwise slopes) over the epochs after the
    warm-up, claimed from 3 such epochs on: the first epoch's allocations
    (compiled programs, optimizer slots, caches filling) are not a leak.

    Across `fit()` calls in one process (notebooks, tuning loops) the same
    figures are kept per fit, whichever detector instance ran it, and their
    growth per fit is judged too.

    The verdict (`detector.verdict`, `detector.summary()`, the TensorBoard
    run's text) says whether memory grows or is stable, how fast, when it
    would exhaust the host or a device at that rate, and the likely cause with
    its fix: models built in a loop without `keras.backend.clear_session()`;
    tensors kept in a callback or a Python list (live tensors grow with the
    bytes); a retrace every epoch (compiled functions grow); a `tf.data`
    cache filling; the allocator's cache (reserved grows while in use does
    not: not a leak).

    Cost: a few tenths of a millisecond per epoch end on the training thread,
    the same at every epoch (the growth rates read at most 24 readings),
    nothing per step. The epoch's figures are read at its end because they
    are logged there; only their TensorBoard events are written later, by the
    fit's own thread. Where live tensors have no registry (TensorFlow, torch) they are
    counted by a walk over the heap (up to a tenth of a second), only once
    growth is seen and at the fit's end: twice a fit at most.

    Every key this fit can log is in each epoch's logs from the first epoch, NaN
    meaning "not yet measured" (or not readable), never zero.
    Logged keys (History, CSVLogger, TensorBoard): docs/keys.md.

    Args:
        warmup_epochs: epochs left out of the growth rate (their growth is
            the warm-up's). Defaults to `1`.
        min_growth_mib: a floor, in MiB per epoch: a rise under it is
            stable however certain. Memory is said to grow by evidence, not
            by size: a rise that is certain (Mann-Kendall's confidence of
            the Theil-Sen slope at least 0.95) and steady (it does not level
            off, as a cache filling does). The floor leaves out a clean
            fit's creep (about 0.02 MiB per epoch of the runtime's own small
            allocations). It used to be the threshold itself (`4.0`), which
            called a steady 1 MiB per epoch stable. Defaults to `0.25`.
        min_growth_mib_per_fit: the same for the growth per fit across the
            process's fit() calls. Defaults to `1.0`.
        log_dir: directory of the TensorBoard logs, or None for no
            TensorBoard output. Defaults to `"logs"`.
        run_name: name of the TensorBoard run under `log_dir`. Defaults to
            `"memory"`.
        verbose: 0 prints nothing; 1 the verdict at the end of `fit()`; 2
            also a line per epoch. Defaults to `1`.
        epoch_logs: whether to add the epoch figures to `logs`. Defaults to
            `True`.
        progress_bar: which of them Keras's progress bar shows: `"brief"`
            (`memory/host_rss_growth_mib_per_epoch`), `"all"` or `"none"`.
            Defaults to `"none"`.
        count_tensors: whether to count live tensors by a walk over the heap
            where the framework keeps no registry of them, once growth is
            seen. Defaults to `True`.

    Example:

    ```python
    from keras_gpu_tools import MemoryLeakDetector

    detector = MemoryLeakDetector(log_dir="logs")
    model.fit(x, y, epochs=20, callbacks=[detector])
    print(detector.verdict.category)   # "grows", "stable" or "unknown"
    print(detector.summary())          # rates, when memory runs out, cause and fix
    ```
    """

    _bar_priority = 2  # the input wait and the GPU's utilization come first

    def __init__(
        self,
        warmup_epochs: int = 1,
        min_growth_mib: float = 0.25,
        min_growth_mib_per_fit: float = 1.0,
        log_dir: str | os.PathLike | None = "logs",
        run_name: str = "memory",
        verbose: int = 1,
        epoch_logs: bool = True,
        progress_bar: str = "none",
        count_tensors: bool = True,
    ):
        super().__init__()
        self.warmup_epochs = check.check_int("warmup_epochs", warmup_epochs, low=0)
        self.min_growth_mib = check.check_number("min_growth_mib", min_growth_mib, low=0)
        self.min_growth_mib_per_fit = check.check_number(
            "min_growth_mib_per_fit", min_growth_mib_per_fit, low=0, exclusive_low=True
        )
        self.run_name = check.check_run_name("run_name", run_name)
        self.verbose = check.check_verbose("verbose", verbose, max_level=2)
        self.epoch_logs = check.check_bool("epoch_logs", epoch_logs)
        self.progress_bar = progress_bar  # checked by the base class
        self.count_tensors = check.check_bool("count_tensors", count_tensors)
        self.log_dir = check.check_log_dir("log_dir", log_dir)
        check.check_run_dir(self.log_dir, self.run_name)
        self.warnings = WarnOnce(MemoryLeakWarning)
        self.epoch_history: list[dict[str, float]] = []  # every epoch of every fit of this instance
        self._fit_epochs: list[dict[str, float]] = []  # the last fit's
        self._track: EpochTrack | None = None
        self._record: FitRecord | None = None
        self._verdict: LeakVerdict | None = None
        self._running = False
        self._devices: list[int] = []
        self._limits: dict[int, float] = {}
        self._compiled: dict[int, int] = {}
        self._pipeline_cache = False
        self._epochs_planned: int | None = None
        self._traces: TraceReader | None = None

    @property
    def verdict(self) -> LeakVerdict | None:
        """The verdict: the last fit's, or the running fit's so far (None before any epoch)."""
        if self._running and self._track is not None and self._track.readings:
            return self._judge()
        return self._verdict

    def summary(self) -> str:
        """The verdict, its evidence and fixes, and the figures per epoch and per fit."""
        return summary_text(self.verdict, self._fit_epochs, [r.row() for r in PROCESS.ended()])

    @staticmethod
    def fit_history() -> list[dict[str, Any]]:
        """The figures of every fit of this process at its end (MiB), oldest first."""
        return [r.row() for r in PROCESS.ended()]

    @staticmethod
    def forget_fits() -> None:
        """Forgets the fits this process has recorded (a new experiment in the same process)."""
        PROCESS.clear()

    # -- readings -------------------------------------------------------------------------
    def _safely(self, key: str, what: str, read: Any, default: Any = None) -> Any:
        """``read()``, or ``default`` with a warning once: a figure that fails is left out, training goes on."""
        try:
            return read()
        except Exception as e:
            self.warnings(key, f"MemoryLeakDetector: {what} could not be read ({type(e).__name__}: {e}); left out.")
            return default

    def _read(self, epoch: int, heap: bool = False) -> Reading:
        b = self.backend
        r = Reading(epoch, time.time(), host_rss=host.rss_bytes())
        if self._devices:  # in use and reserved from one read of each device's allocator figures
            stats, r.reserved = self._safely(
                "device", "the allocator's memory", lambda: b.allocator_readings(self._devices), ({}, {})
            )
            r.in_use = {i: cur for i, (cur, _peak) in stats.items()}
        r.tensors = self._safely("tensors", "live tensors", lambda: b.live_tensors(heap))
        traces = self._traces if self._traces is not None else TraceReader(b, self.model, FUNCTIONS)
        counts = self._safely("compiled", "compiled functions", traces)
        if counts:
            for k, n in counts.items():  # functions replaced by a recompile keep counting
                self._compiled[k] = max(n, self._compiled.get(k, 0))
            r.compiled = sum(self._compiled.values())
        return r

    def _census(self, reading: Reading) -> None:
        """Counts live tensors by a walk over the heap (where there is no cheaper way), into ``reading``."""
        found = self._safely("census", "live tensors (heap walk)", lambda: self.backend.live_tensors(heap=True))
        if found is not None and self._track is not None:
            reading.tensors = found
            self._track.censuses.append(Census(reading.epoch, found[0], found[1]))

    # -- Keras hooks ------------------------------------------------------------------------
    @override
    def _start_fit(self, session) -> None:
        b = self.backend
        self._fit_epochs, self._compiled, self._verdict = [], {}, None
        self._devices = list(range(len(self._safely("devices", "the GPU list", b.gpu_devices, []))))
        peaks = self._safely("limits", "the devices' capacity", b.device_peaks, {}) if self._devices else {}
        self._limits = {i: float(cap) for i, (_peak, cap) in peaks.items() if cap}
        self._pipeline_cache = bool(ki.describe_pipeline(self.model).get("cache"))
        self._epochs_planned = (self.params or {}).get("epochs")
        self._record = PROCESS.begin(self.model, ki.named_objects())
        # The compiled functions found once, not at every epoch end.
        self._traces = TraceReader(b, self.model, FUNCTIONS)
        self._track = EpochTrack(self.warmup_epochs, self._read(-1))
        self._open_writers(job=False, session=session)  # its epochs' figures written off the training thread
        self._running = True

    @override
    def _planned_epoch_keys(self) -> set[str]:
        """What the start reading has, and the growth rates (and heap counts) if the fit has epochs enough."""
        keys = set(self._track.start.figures()) if self._track is not None else set()
        if self._epochs_planned is None or self._epochs_planned >= self.warmup_epochs + MIN_EPOCHS:
            growth = {schema.MEMORY_HOST_RSS_MIB: schema.MEMORY_HOST_GROWTH}
            growth[schema.MEMORY_DEVICE_IN_USE_MIB] = schema.MEMORY_DEVICE_GROWTH
            keys |= {rate for key, rate in growth.items() if key in keys}
            if self.count_tensors:  # a heap walk once growth is seen
                keys |= {schema.MEMORY_LIVE_TENSORS, schema.MEMORY_LIVE_TENSOR_MIB}
        return keys

    @override
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._running or self._track is None:
            return
        reading = self._read(epoch)
        track = self._track
        track.add(reading)
        # What an epoch end logs: the rates alone (the rest at the fit's end), over at most MAX_POINTS readings.
        g = track.growth(brief=True, halves=False)
        if reading.tensors is None and self.count_tensors and not track.censuses and self._may_grow(g):
            g = track.with_halves(g)  # the halves' slopes too: whether the rise is steady, as the verdict judges
            if grows(g.host, self.min_growth_mib) or grows(g.device, self.min_growth_mib):
                self._census(reading)  # once growth is seen: the first of two counts, the second at the fit's end
        figures = reading.figures()
        if g.host is not None:
            figures[schema.MEMORY_HOST_GROWTH] = g.host.per_unit
        if g.device is not None:
            figures[schema.MEMORY_DEVICE_GROWTH] = g.device.per_unit
        self._fit_epochs.append(figures)
        self.epoch_history.append(figures)
        if self.epoch_logs:
            self._epoch_figures(figures, logs, brief=schema.MEMORY_HOST_GROWTH)
        if self._writer is not None:
            write_epoch(self._writer, figures, PROCESS.next_epoch())
        if self.verbose > 1:
            self._print(epoch_line(epoch, figures))

    def _may_grow(self, g: Growth) -> bool:
        """Whether a rate passes what ``grows`` asks but the halves (positive, over the floor, certain)."""
        floor = self.min_growth_mib
        return any(
            s is not None and s.per_unit > 0 and s.per_unit >= floor and s.confidence >= CERTAIN
            for s in (g.host, g.device)
        )

    @override
    def on_train_end(self, logs: dict | None = None) -> None:
        track = self._track
        if not self._running or track is None:
            return
        if track.censuses and track.readings and track.readings[-1].epoch > track.censuses[-1].epoch:
            self._census(track.readings[-1])  # the second count: the tensors kept since the first
        self._end_record()
        self._verdict = self._judge()
        if self._writer is not None:
            step = PROCESS.epochs_seen
            write_fit(self._writer, self._verdict, self.summary(), self._fit_epochs, PROCESS.ended(), step)
        if self.verbose:
            self._print(*fit_lines(self._verdict, self.run_dir))
        super().on_train_end(logs)

    def _end_record(self) -> None:
        rec, track = self._record, self._track
        if rec is not None and rec.end is None and track is not None:
            rec.end = track.readings[-1] if track.readings else self._read(-1)
            rec.epochs = len(track.readings)

    def _judge(self) -> LeakVerdict:
        track = self._track
        assert track is not None
        done = len(track.readings)
        ctx = Context(
            threshold_mib=self.min_growth_mib,
            fit_threshold_mib=self.min_growth_mib_per_fit,
            warmup_epochs=self.warmup_epochs,
            last=track.readings[-1] if track.readings else track.start,
            host_available=host.available_bytes(),
            device_limits=self._limits,
            seconds_per_epoch=track.seconds_per_epoch(),
            epochs_left=max(self._epochs_planned - done, 0) if self._epochs_planned and self._running else None,
            pipeline_cache=self._pipeline_cache,
            allocator_note=self.backend.allocator_cache_note,
        )
        return judge(track.growth(), PROCESS.growth(), ctx)

    @override
    def _stop_fit(self, aborted: bool) -> None:
        if aborted:
            self._safely("end", "the fit's last figures", self._end_record)
        self._running = False
        self._close_writers()

    def __repr__(self) -> str:
        v = self.verdict
        return (
            f"MemoryLeakDetector(warmup_epochs={self.warmup_epochs}, min_growth_mib={self.min_growth_mib:g}, "
            f"verdict={v.category if v else 'unknown'!r})"
        )
