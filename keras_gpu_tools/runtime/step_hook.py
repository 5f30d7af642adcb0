"""One per-step hook on ``model.train_function``, shared by every callback.

Keras has no per-step timing and no per-step extension point below the batch
callbacks. :class:`StepHook` replaces ``model.train_function`` with one
wrapper (marked, so a model is never wrapped twice) and runs a small list of
observers around each call. What an observer has is typed in
:mod:`keras_gpu_tools.runtime.step_observer`: ``sample(index)`` and
``on_step(record)`` always; ``next_sample``, ``next_fetch``, ``around``,
``inner`` and ``on_detach`` where it needs them. The hook looks the optional
ones up when an observer attaches or detaches, never per call.

Calls nobody needs take the fast path: an index check, Keras's function (or
the observers' ``inner`` chain) and nothing else: no record, no clock, no
sync. The call right after a sampled one takes the full path too (its start
ends the sampled call's gap), and its record's interval covers the fast calls
that follow it (``StepRecord.covers``), so the intervals still tile the wall
time and the steps still add up.

What a call does per backend (fetch, sync, what is timed) is the backend's
``step_caller`` (``keras_gpu_tools/backends``); this module is the same for
all of them. ``docs/architecture.md`` follows one step through it.

The hook belongs to one :class:`~keras_gpu_tools.runtime.session.FitSession`.
It is removed by :meth:`StepHook.detach` when its last observer leaves
(``on_train_end``, or the session's teardown after a fit that raised). A hook
left behind by a fit that died steps aside by itself: every call checks that
it comes from its own fit() (one identity test); a call from another fit
aborts the old session on the spot, on the training thread, and goes
straight to Keras's own function.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim, leaves
from keras_gpu_tools.runtime.session import run_deferred
from keras_gpu_tools.runtime.step_observer import StepObserver
from keras_gpu_tools.runtime.step_record import StepRecord

logger = logging.getLogger("keras_gpu_tools")

MARK = "_keras_gpu_tools_step_hook"
_NEVER = 1 << 62  # no call needs the full path


#: An observer's ``around(record, call)`` (:class:`~keras_gpu_tools.runtime.step_observer.WrapsSteps`).
Around = Callable[[StepRecord, Callable[[], Any]], Any]


def _ALWAYS(index: int) -> int:  # the schedule of an observer without next_sample: every call
    return index


def _asked(ask: Callable[[int], int | None], index: int, failed: int | None) -> int | None:
    try:
        return ask(index)
    except Exception:  # monitoring never stops training
        return failed


__all__ = ["MARK", "Attachment", "StepHook", "batch_signature", "leading_dim", "leaves"]


class Attachment:
    """An observer's place on a hook; detach it with :meth:`StepHook.detach`."""

    def __init__(self, hook: StepHook, observer: StepObserver):
        self.hook = hook
        self.observer = observer
        self.active = True

    def detach(self) -> None:
        self.hook.detach(self)


class StepHook:
    """The wrapper of one model's train function.

    Use :meth:`attach` (from ``on_train_begin``); never construct directly.
    The attributes without a leading underscore are what the backends'
    step callers use.
    """

    def __init__(self, model, backend, session, original: Callable, clock: Callable[[], float] = time.perf_counter):
        self.model_ref = model
        self.backend = backend
        self.session = session
        self.original = original
        self.inner = original  # what each call runs: `original`, wrapped by observers' `inner(fn)`
        self.clock = clock
        self.steps_per_execution = ki.steps_per_execution(model)
        self.attachments: list[Attachment] = []
        self._observers: tuple[StepObserver, ...] = ()  # of the attachments, kept by _rebuild_inner
        # Their (next_sample, next_fetch), looked up on attach and detach.
        self._schedules: tuple[tuple[Callable[[int], int | None], Callable[[int], int | None] | None], ...] = ()
        self.arounds: tuple[Around, ...] = ()  # the observers' `around`, outermost first
        self._lock = threading.Lock()
        self._index = 0
        self._pending: StepRecord | None = None
        self.last_outputs = None
        self._pending_fetch = 0.0  # fetch time reported before the call (torch)
        self.fetch_known = backend.fetches_inside_step
        self.undo_fetch_timer: Callable[[], None] | None = None
        self._seen_signatures: set[Any] = set()
        self._errors_logged: set[tuple[str, str]] = set()
        self.fetch_overhead = 0.0  # TF: the cost of a Python next() itself, subtracted from fetches
        self.fetch_overhead_unknown = True
        self.fetch_timer = None
        # Count a step's FLOPs: a sampled, non-warm-up call keeps its arguments (JAX, TensorFlow) or its
        # counted FLOPs (torch) in record.extra["step_args"], for Backend.shape_specs and step_flops.
        self.capture_args = False
        self._next_full = 0  # the next call index that leaves the fast path (full or light)
        self._next_heavy = 0  # the next call index that takes the full path
        self._call = backend.step_caller(self)
        self._light = backend.fetch_caller(self)  # None: this backend times fetches on the full path only
        self.wrapper = self._make_wrapper()

    # -- installing ---------------------------------------------------------------
    @classmethod
    def installed(cls, model) -> StepHook | None:
        fn = getattr(model, "train_function", None)
        return getattr(fn, MARK, None)

    @classmethod
    def attach(
        cls, model, observer: StepObserver, backend, session, clock: Callable[[], float] = time.perf_counter
    ) -> Attachment:
        """Adds ``observer`` to the model's hook for this fit ``session``, installing the hook if needed."""
        hook = cls.installed(model)
        if hook is not None and hook.session is not session:
            logger.debug("keras_gpu_tools: removing a step hook left by a fit() that did not end cleanly")
            hook._remove(stale=True)
            hook = None
        if hook is None:
            original = ki.get_train_function(model)
            hook = cls(model, backend, session, original, clock=clock)
            backend.prepare_hook(hook)
            ki.set_train_function(model, hook.wrapper)
        att = Attachment(hook, observer)
        with hook._lock:
            hook.attachments.append(att)
            hook._rebuild_inner()
        hook.reschedule()
        return att

    @classmethod
    def detach_observer(cls, model, observer: StepObserver) -> None:
        """Removes ``observer`` from the model's hook, wherever it was attached (a failed start)."""
        hook = cls.installed(model)
        if hook is None:
            return
        for att in [a for a in hook.attachments if a.observer is observer]:
            hook.detach(att)

    def _rebuild_inner(self) -> None:
        """Recomputes what each call uses from the observers (on attach and detach, never per call)."""
        fn = self.original
        for a in self.attachments:
            wrap = getattr(a.observer, "inner", None)
            if wrap is not None:
                fn = wrap(fn)
        self.inner = fn
        self._observers = tuple(a.observer for a in self.attachments)
        self._schedules = tuple(
            (getattr(o, "next_sample", _ALWAYS), getattr(o, "next_fetch", None) if self._light is not None else None)
            for o in self._observers
        )
        arounds = (getattr(o, "around", None) for o in self._observers)
        self.arounds = tuple(around for around in arounds if around is not None)

    def on_fetch(self, seconds: float) -> None:
        """A fetch that happened before the call (torch's epoch iterator)."""
        self._pending_fetch += seconds

    def detach(self, att: Attachment) -> None:
        with self._lock:
            if not att.active:
                return
            att.active = False
            if att in self.attachments:
                self.attachments.remove(att)
            self._rebuild_inner()
            last = not self.attachments
        self.reschedule()
        _notify_detach(att, stale=False)
        if last:
            self._remove(stale=False)

    def _remove(self, stale: bool) -> None:
        with self._lock:
            atts, self.attachments = list(self.attachments), []
            self._observers, self.arounds, self._schedules = (), (), ()
            for a in atts:
                a.active = False
            undo, self.undo_fetch_timer = self.undo_fetch_timer, None
        model = self.model_ref
        if getattr(model, "train_function", None) is self.wrapper:
            ki.set_train_function(model, self.original)
        if undo is not None:
            undo()
        self._pending = None
        self.last_outputs = None
        for a in atts:
            _notify_detach(a, stale)

    @property
    def next_index(self) -> int:
        """The index the next call of the train function will have."""
        return self._index

    @property
    def observers(self) -> tuple[StepObserver, ...]:
        return self._observers

    # -- per call -------------------------------------------------------------------
    def _emit(self, rec: StepRecord) -> None:
        for obs in self.observers:
            try:
                obs.on_step(rec)
            except Exception as e:  # monitoring must never stop training
                key = (type(obs).__name__, type(e).__name__)
                if key not in self._errors_logged:
                    self._errors_logged.add(key)
                    logger.exception(
                        "keras_gpu_tools: %s.on_step raised; it is skipped from now on for this error",
                        type(obs).__name__,
                    )

    def flush(self) -> None:
        """Hands the pending call to the observers without a gap (epoch end).

        Fast calls made since it are added to it (``covers``), its interval then
        running until they are done (one sync per epoch, only if there were any).
        """
        rec, self._pending = self._pending, None
        self._pending_fetch = 0.0
        if rec is None:
            return
        start = rec.extra.pop("_call_start", None)
        fast = self._index - rec.index - 1
        if fast > 0 and rec.end is not None and start is not None:
            try:
                self.sync(self.last_outputs)
            except Exception as e:  # outputs no longer valid (their buffers donated to a step run
                # without us, after something replaced the train function): the interval ends now
                logger.debug("keras_gpu_tools: the epoch-end sync failed (%s); interval taken unsynced", e)
            rec.covers = fast * self.steps_per_execution
            rec.interval = self.clock() - start
        elif rec.end is not None and start is not None:  # the epoch's last call: its own time, epoch end apart
            rec.interval = rec.end - start
            rec.epoch_end = True
        if rec.end is not None:
            self._emit(rec)

    # -- scheduling the full path ---------------------------------------------------------
    def reschedule(self, after_sampled: bool = False) -> None:
        """Sets the next call that takes the full path (the observers' ``next_sample``)."""
        index = self._index
        nxt = index if after_sampled else None
        light = None
        for ask_sample, ask_fetch in self._schedules:
            k = _asked(ask_sample, index, failed=index)  # an observer that fails gets every call
            if k is not None and (nxt is None or k < nxt):
                nxt = max(k, index)
            k = None if ask_fetch is None else _asked(ask_fetch, index, failed=None)
            if k is not None and (light is None or k < light):
                light = max(k, index)
        heavy = nxt if nxt is not None else _NEVER
        self._next_heavy = heavy
        self._next_full = heavy if light is None else min(heavy, light)

    def wants_full(self) -> bool:
        """Whether the next call's fetch is timed: the full or the light path (torch's fetch timer asks before it)."""
        return self._index >= self._next_full

    def take_fetch(self) -> float:
        """The fetch time reported before this call (torch), handed over once."""
        seconds, self._pending_fetch = self._pending_fetch, 0.0
        return seconds

    def add_covered_fetch(self, seconds: float, steps: int) -> None:
        """A light call's fetch, to the pending record (whose interval covers the call)."""
        rec = self._pending
        if rec is not None:
            rec.covered_fetch += seconds
            rec.covered_fetch_steps += steps

    def begin(self, presync: Callable[[], None] | None = None) -> StepRecord:
        """Closes the previous call's record and opens this call's.

        ``presync`` (run only if the call is sampled) waits for the device to
        finish the work in flight. That time belongs to the previous calls,
        so the previous record's interval runs until it is done: the
        intervals tile the wall time.
        """
        t = self.clock()
        fetch = self._pending_fetch
        self._pending_fetch = 0.0
        index = self._index
        self._index += 1
        sampled = False
        for obs in self.observers:
            try:
                if obs.sample(index):
                    sampled = True
            except Exception:
                pass
        t_start = t
        if sampled and presync is not None:
            presync()
            t_start = self.clock()
        prev = self._pending
        if prev is not None and prev.end is not None:
            prev.covers = (index - prev.index - 1) * self.steps_per_execution  # fast calls in between
            prev.interval = t_start - prev.extra.pop("_call_start", prev.start)
            prev.gap = max(0.0, t - prev.end - (0.0 if self.backend.fetches_inside_step else fetch))
            self._emit(prev)
        # Was this call's fetch made right after a sync (its own presync, where the
        # fetch is inside the step; or the previous call's final sync)?
        after_sync = (sampled and self.backend.fetches_inside_step) or (
            prev is not None and prev.sampled and prev.index == index - 1
        )
        rec = StepRecord(
            index=index, sampled=sampled, warmup=index == 0, steps=self.steps_per_execution, after_sync=after_sync
        )
        rec.extra["_call_start"] = t_start
        if not self.backend.fetches_inside_step and self.fetch_known:
            rec.fetch = fetch
        self._pending = rec
        return rec

    def check_signature(self, rec: StepRecord, batch) -> None:
        if not rec.sampled:
            return
        sig = batch_signature(batch)
        rec.signature = sig
        if sig not in self._seen_signatures:
            self._seen_signatures.add(sig)
            rec.warmup = True  # first time this shape runs on the sampled path

    def around(self, rec: StepRecord, call: Callable[[], Any]):
        for fn in reversed(self.arounds):
            call = (lambda f, c: lambda: f(rec, c))(fn, call)
        return call()

    def _make_wrapper(self) -> Callable:
        call, light = self._call, self._light
        session = self.session  # its `frame`, not a copy: the session lets go of fit()'s frame when it closes
        getframe = sys._getframe

        def train_function(*args):
            # From fit()'s own frame (one identity test), or else from a frame below
            # this session's fit() (a wrapper of Keras's or another tool's in between).
            if getframe(1) is not session.frame and (session.closed or not session.is_fit_frame(getframe(1))):
                return self._stale_call(args)
            i = self._index
            if i < self._next_full:  # nobody needs this call: Keras's step and a counter
                self._index = i + 1
                self.last_outputs = out = self.inner(*args)
                return out
            if i < self._next_heavy:  # only its fetch is timed (the light path)
                self._index = i + 1
                try:
                    self.last_outputs = out = light(*args)
                finally:
                    self.reschedule()
                return out
            try:
                out = call(*args)
            except BaseException:
                self._pending = None  # end of data, or an error: not a step
                self.reschedule()
                raise
            pending = self._pending
            self.reschedule(after_sampled=pending is not None and pending.sampled)
            return out

        setattr(train_function, MARK, self)
        train_function.__wrapped__ = self.original  # type: ignore[attr-defined]
        return train_function

    def _stale_call(self, args):
        """A call from another fit(): the fit that installed us died unnoticed."""
        logger.debug("keras_gpu_tools: a step hook of a fit() that did not end cleanly was called; removing it")
        run_deferred()  # teardowns the watchdog left to this thread (torch's profiler)
        self.session.abort(on_training_thread=True)
        if self.attachments:  # the session did not own every observer: remove the hook anyway
            self._remove(stale=True)
        elif getattr(self.model_ref, "train_function", None) is self.wrapper:
            ki.set_train_function(self.model_ref, self.original)
        return self.original(*args)

    # -- syncs -------------------------------------------------------------------------
    def sync(self, outputs) -> None:
        self.backend.sync(outputs)


def _notify_detach(att: Attachment, stale: bool) -> None:
    cb = getattr(att.observer, "on_detach", None)
    if cb is not None:
        try:
            cb(stale)
        except Exception:
            logger.exception("keras_gpu_tools: an observer's on_detach raised")
