"""One per-step hook on ``model.train_function``, shared by every callback.

Keras has no per-step timing and no per-step extension point below the batch
callbacks. :class:`StepHook` replaces ``model.train_function`` with one
wrapper (marked, so a model is never wrapped twice) and runs a small list of
observers around each call:

- ``observer.sample(index) -> bool``: whether call ``index`` (0 = the first
  call since the hook was installed) should be timed in full. A sampled call
  is synced with the device before and after, and on TensorFlow its batches
  are fetched in Python so the fetch can be timed. Unsampled calls are passed
  to Keras untouched (no sync, same compiled path).
- ``observer.on_step(record)``: receives the :class:`StepRecord` of every call,
  once the gap to the next call is known (or at :meth:`StepHook.flush`).
- ``observer.around(record, call)`` (optional): runs ``call()`` (the fetch and
  the step) and returns its result, for per-step contexts such as profiler
  step markers or retrying a batch.
- ``observer.inner(fn)`` (optional): returns the function each call runs in
  place of ``fn`` (Keras's train function, or the next observer's
  replacement), with the same arguments (on TF's unsampled path it receives
  the ``tf.data`` iterator), for example to fetch the batch in Python and
  retry it. Called again whenever an observer attaches or detaches.
- ``observer.on_detach(stale)`` (optional): the hook was removed.

Per backend (see ``KERAS-INTERNALS.md``):

- TensorFlow, ``f(iterator)``: unsampled calls go straight to Keras's compiled
  loop. A sampled call pulls its batches from the iterator in Python (timed)
  and runs them through Keras's per-batch ``one_step_on_data``; with
  ``steps_per_execution=N`` it pulls N batches and so measures per execution.
- JAX, ``f(state, iterator)``: the iterator is wrapped so every ``next()`` is
  timed (the fetch is measured on every step); a sync is
  ``jax.block_until_ready``.
- torch, ``f(batches)``: batches are fetched by fit() before the call, so the
  epoch iterator is wrapped (``compat.time_epoch_iterator``) to time each
  fetch; a sync is ``torch.cuda.synchronize()`` on CUDA only.

The wrapper is removed by :meth:`StepHook.detach` when its last observer
leaves (``on_train_end``, or a :class:`FitGuard` after a fit that raised); a
wrapper left behind by a fit that died is found and removed at the next
:meth:`StepHook.attach`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from keras_gpu_tools._core import compat, deps
from keras_gpu_tools._core.lifecycle import find_fit_frame
from keras_gpu_tools._core.step_timing import StepRecord

logger = logging.getLogger("keras_gpu_tools")

MARK = "_keras_gpu_tools_step_hook"


def batch_signature(batch) -> tuple:
    """Shapes and dtypes of a (nested) batch; cheap, no framework import."""
    out = []
    stack = [batch]
    while stack and len(out) < 64:
        b = stack.pop()
        if isinstance(b, (tuple, list)):
            stack.extend(reversed(b))
        elif isinstance(b, dict):
            stack.extend(reversed([b[k] for k in sorted(b, key=str)]))
        elif b is not None:
            shape = getattr(b, "shape", None)
            out.append((tuple(shape) if shape is not None else None, str(getattr(b, "dtype", type(b).__name__))))
    return tuple(out)


def leading_dim(batch) -> int | None:
    """The batch size: the first dimension of the first array in the batch."""
    b = batch
    for _ in range(8):
        if isinstance(b, (tuple, list)):
            if not b:
                return None
            b = b[0]
        elif isinstance(b, dict):
            if not b:
                return None
            b = next(iter(b.values()))
        else:
            break
    shape = getattr(b, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    try:
        return int(shape[0])
    except (TypeError, ValueError):
        return None


class _FetchTimer:
    """Wraps the JAX train function's iterator: times and counts each next()."""

    __slots__ = ("it", "clock", "total", "count", "samples", "last")

    def __init__(self, clock):
        self.clock = clock

    def reset(self, it):
        self.it = it
        self.total = 0.0
        self.count = 0
        self.samples = 0
        self.last = None
        return self

    def __iter__(self):
        return self

    def __next__(self):
        t = self.clock()
        try:
            batch = next(self.it)
        finally:
            self.total += self.clock() - t
        self.count += 1
        self.last = batch
        n = leading_dim(batch)
        self.samples = None if (n is None or self.samples is None) else self.samples + n
        return batch


class Attachment:
    """An observer's place on a hook; detach it with :meth:`StepHook.detach`."""

    def __init__(self, hook: StepHook, observer):
        self.hook = hook
        self.observer = observer
        self.active = True

    def detach(self) -> None:
        self.hook.detach(self)


class StepHook:
    """The wrapper of one model's train function.

    Use :meth:`attach` (from ``on_train_begin``); never construct directly.
    """

    def __init__(self, model, backend: str, original: Callable, clock: Callable[[], float] = time.perf_counter):
        self.model_ref = model
        self.backend = backend
        self.original = original
        self.inner = original  # what each call runs: `original`, wrapped by observers' `inner(fn)`
        self.clock = clock
        self.steps_per_execution = compat.steps_per_execution(model)
        self.attachments: list[Attachment] = []
        self._lock = threading.Lock()
        self._fit_frame = self._current_fit_frame_id(model)
        self._index = 0
        self._pending: StepRecord | None = None
        self._last_outputs = None
        self._pending_fetch = 0.0  # torch: fetch time since the previous call
        self._fetch_known = backend != "torch"
        self._undo_fetch_timer: Callable[[], None] | None = None
        self._seen_signatures = set()
        self._timer = _FetchTimer(clock)
        self._errors_logged = set()
        self._tf_fetch_overhead = 0.0
        self._jax_async: bool | None = None
        self.capture_args = False  # JAX: keep a sampled call's (state, batch) in record.extra["jax_args"]
        self._tf_fetch_overhead_unknown = backend == "tensorflow"
        self.wrapper = self._make_wrapper()

    # -- installing ---------------------------------------------------------------
    @staticmethod
    def _current_fit_frame_id(model):
        import sys

        frame = find_fit_frame(model, sys._getframe(1))
        try:
            return id(frame) if frame is not None else None
        finally:
            del frame

    @classmethod
    def installed(cls, model) -> StepHook | None:
        fn = getattr(model, "train_function", None)
        return getattr(fn, MARK, None)

    @classmethod
    def attach(
        cls, model, observer, backend: str | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> Attachment:
        """Adds ``observer`` to the model's hook, installing the hook if needed."""
        if backend is None:
            backend = deps.keras_backend()
        hook = cls.installed(model)
        if hook is not None and hook._fit_frame != cls._current_fit_frame_id(model):
            logger.debug("keras_gpu_tools: removing a step hook left by a fit() that did not end cleanly")
            hook._remove(stale=True)
            hook = None
        if hook is None:
            original = compat.get_train_function(model)
            hook = cls(model, backend, original, clock=clock)
            if backend == "torch":
                hook._install_fetch_timer()
            compat.set_train_function(model, hook.wrapper)
        att = Attachment(hook, observer)
        with hook._lock:
            hook.attachments.append(att)
            hook._rebuild_inner()
        return att

    def _rebuild_inner(self) -> None:
        fn = self.original
        for a in self.attachments:
            wrap = getattr(a.observer, "inner", None)
            if wrap is not None:
                fn = wrap(fn)
        self.inner = fn

    def _install_fetch_timer(self) -> None:
        ei = compat.find_epoch_iterator(self.model_ref)
        if ei is None:
            logger.warning(
                "keras_gpu_tools: could not find fit()'s epoch iterator (Keras %s); input fetch time is not measured on torch.",
                compat.keras_version(),
            )
            return
        self._fetch_known = True
        self._undo_fetch_timer = compat.time_epoch_iterator(ei, self._on_fetch, self.clock)

    def _on_fetch(self, seconds: float) -> None:
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
        _notify_detach(att, stale=False)
        if last:
            self._remove(stale=False)

    def _remove(self, stale: bool) -> None:
        with self._lock:
            atts, self.attachments = list(self.attachments), []
            for a in atts:
                a.active = False
            undo, self._undo_fetch_timer = self._undo_fetch_timer, None
        model = self.model_ref
        if getattr(model, "train_function", None) is self.wrapper:
            compat.set_train_function(model, self.original)
        if undo is not None:
            undo()
        self._pending = None
        self._last_outputs = None
        for a in atts:
            _notify_detach(a, stale)

    @property
    def next_index(self) -> int:
        """The index the next call of the train function will have."""
        return self._index

    @property
    def observers(self) -> list[Any]:
        return [a.observer for a in self.attachments]

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
        """Hands the pending call to the observers without a gap (epoch end)."""
        rec, self._pending = self._pending, None
        self._pending_fetch = 0.0
        if rec is not None:
            rec.extra.pop("_call_start", None)
        if rec is not None and rec.end is not None:
            self._emit(rec)

    def _begin(self, presync: Callable[[], None] | None = None) -> StepRecord:
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
            prev.interval = t_start - prev.extra.pop("_call_start", prev.start)
            prev.gap = max(0.0, t - prev.end - (fetch if self.backend == "torch" else 0.0))
            self._emit(prev)
        rec = StepRecord(index=index, sampled=sampled, warmup=index == 0, steps=self.steps_per_execution)
        rec.extra["_call_start"] = t_start
        if self.backend == "torch" and self._fetch_known:
            rec.fetch = fetch
        self._pending = rec
        return rec

    def _check_signature(self, rec: StepRecord, batch) -> None:
        if not rec.sampled:
            return
        sig = batch_signature(batch)
        rec.signature = sig
        if sig not in self._seen_signatures:
            self._seen_signatures.add(sig)
            rec.warmup = True  # first time this shape runs on the sampled path

    def _around(self, rec: StepRecord, call: Callable[[], Any]):
        arounds = [o.around for o in self.observers if getattr(o, "around", None) is not None]
        for fn in reversed(arounds):
            call = (lambda f, c: lambda: f(rec, c))(fn, call)
        return call()

    def _make_wrapper(self) -> Callable:
        impl = {"tensorflow": self._call_tf, "jax": self._call_jax, "torch": self._call_torch}.get(self.backend)
        if impl is None:
            raise ValueError(f"keras_gpu_tools: no step hook for the Keras backend {self.backend!r}.")

        def train_function(*args):
            try:
                return impl(*args)
            except BaseException:
                self._pending = None  # end of data, or an error: not a step
                raise

        setattr(train_function, MARK, self)
        train_function.__wrapped__ = self.original
        return train_function

    # -- syncs -------------------------------------------------------------------------
    def sync(self, outputs) -> None:
        if outputs is None:
            return
        if self.backend == "jax":
            jax = deps.loaded("jax")
            if jax is not None:
                jax.block_until_ready(outputs)
        elif self.backend == "tensorflow":
            leaf = _first_leaf(outputs)
            if leaf is not None and hasattr(leaf, "numpy"):
                leaf.numpy()  # a device-to-host copy waits for the stream
        elif self.backend == "torch":
            torch = deps.loaded("torch")
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()

    # -- TensorFlow --------------------------------------------------------------------
    def _call_tf(self, iterator):
        rec = self._begin(lambda: self.sync(self._last_outputs))
        original = self.inner
        has_around = any(getattr(o, "around", None) is not None for o in self.observers)
        if not rec.sampled and compat.tf_is_graph_iterator(iterator):
            rec.start = self.clock()
            out = self._around(rec, lambda: original(iterator)) if has_around else original(iterator)
            rec.end = self.clock()
            self._last_outputs = out
            return out
        clock = self.clock
        rec.start = clock()

        def call():
            batches = []
            end_errors = compat.tf_end_of_data_errors()
            for _ in range(self.steps_per_execution):
                try:
                    batches.append(next(iterator))
                except end_errors:
                    break
            if not batches:
                raise StopIteration
            fetched = clock()
            rec.fetch = max(0.0, fetched - rec.start - self._tf_fetch_overhead * len(batches))
            rec.steps = len(batches)
            n = leading_dim(batches[0])
            rec.samples = n * len(batches) if n is not None else None
            self._check_signature(rec, batches[0])
            out = compat.tf_run_batches(original, batches)
            if rec.sampled:
                self.sync(out)
                rec.compute = clock() - fetched
                if self._tf_fetch_overhead_unknown:
                    self._calibrate_tf_fetch(batches[0])
            return out

        out = self._around(rec, call) if has_around else call()
        rec.end = clock()
        self._last_outputs = out
        return out

    def _calibrate_tf_fetch(self, batch) -> None:
        """The cost of ``next()`` itself on a ready element of this structure.

        A sampled TensorFlow step fetches in Python, which costs ~0.1 ms per
        batch that Keras's compiled loop does not pay. It is measured once on
        an in-memory dataset holding this batch and subtracted from the fetch.
        """
        self._tf_fetch_overhead_unknown = False
        tf = deps.loaded("tensorflow")
        if tf is None:
            return
        try:
            it = iter(tf.data.Dataset.from_tensors(batch).repeat())
            next(it)
            best = float("inf")
            for _ in range(7):
                t = self.clock()
                next(it)
                best = min(best, self.clock() - t)
            self._tf_fetch_overhead = best if best != float("inf") else 0.0
        except Exception:
            self._tf_fetch_overhead = 0.0

    # -- JAX ------------------------------------------------------------------------------
    def _jax_async_device(self) -> bool:
        if self._jax_async is None:
            jax = deps.loaded("jax")
            try:
                self._jax_async = jax is not None and jax.default_backend() != "cpu"
            except Exception:
                self._jax_async = False
        return self._jax_async

    def _call_jax(self, state, iterator):
        jax = deps.loaded("jax")
        rec = self._begin(
            lambda: jax.block_until_ready(state) if jax is not None else None
        )  # before the step donates it
        timer = self._timer.reset(iterator)
        rec.start = self.clock()
        out = self._around(rec, lambda: self.inner(state, timer))
        returned = self.clock()
        if rec.sampled and jax is not None:
            jax.block_until_ready(out)
        rec.end = self.clock()
        rec.fetch = timer.total
        rec.steps = max(timer.count, 1)
        rec.samples = timer.samples if timer.count else None
        if rec.sampled:
            if self._jax_async_device():
                # On a GPU the step's single executable is launched when the
                # call returns; the Python before it (argument handling) is
                # host time that overlaps the previous step in a pipeline.
                rec.compute = rec.end - returned
                rec.dispatch = max(0.0, returned - rec.start - timer.total)
            else:
                rec.compute = rec.end - rec.start - timer.total
            self._check_signature(rec, timer.last)
            if self.capture_args:  # shapes for an observer's cost analysis
                rec.extra["jax_args"] = (state, timer.last)
        timer.it = timer.last = None
        return out

    # -- torch ----------------------------------------------------------------------------
    def _call_torch(self, data):
        rec = self._begin(lambda: self.sync(True))
        rec.start = self.clock()
        out = self._around(rec, lambda: self.inner(data))
        if rec.sampled:
            self.sync(True)
        rec.end = self.clock()
        try:
            rec.steps = max(len(data), 1)
            n = leading_dim(data[0])
            rec.samples = n * len(data) if n is not None else None
        except TypeError:
            pass
        if rec.sampled:
            rec.compute = rec.end - rec.start
            try:
                self._check_signature(rec, data[0])
            except (TypeError, IndexError):
                pass
        return out


def _notify_detach(att: Attachment, stale: bool) -> None:
    cb = getattr(att.observer, "on_detach", None)
    if cb is not None:
        try:
            cb(stale)
        except Exception:
            logger.exception("keras_gpu_tools: an observer's on_detach raised")


def leaves(tree):
    """The non-None leaves of nested dicts, lists and tuples (no framework import)."""
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, dict):
            stack.extend(t.values())
        elif isinstance(t, (list, tuple)):
            stack.extend(t)
        elif t is not None:
            yield t


def _first_leaf(tree):
    return next(leaves(tree), None)
