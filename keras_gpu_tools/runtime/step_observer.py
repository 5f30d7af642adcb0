"""What the step hook asks of its observers: :class:`StepObserver`, and the optional methods it looks for.

An observer (a callback's per-step part) must have ``sample`` and ``on_step``.
The other methods are optional: the hook looks them up once, when an observer
attaches or detaches (never per step), and treats a missing one as "nothing
to add". Each optional method has a protocol of its own below, so that an
observer can be checked against the ones it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from keras_gpu_tools.runtime.step_record import StepRecord


class StepObserver(Protocol):
    """What every observer of :class:`~keras_gpu_tools.runtime.step_hook.StepHook` has."""

    def sample(self, index: int) -> bool:
        """Whether call ``index`` (0 = the first since the hook was installed) is timed in full.

        A sampled call is synced with the device before and after, and on
        TensorFlow its batches are fetched in Python so the fetch can be timed.
        Asked only for calls on the full path.
        """
        ...

    def on_step(self, record: StepRecord) -> None:
        """The record of a call on the full path, once the gap to the next call is known (or at ``flush``)."""
        ...


class SchedulesSamples(Protocol):
    """Optional: which calls an observer needs on the full path. Without it, it gets every call."""

    def next_sample(self, index: int) -> int | None:
        """The first call at or after ``index`` that needs the full path (sampled, or wrapped by ``around``).

        None for none. The hook asks after each call on the full path; an
        observer whose answer changes between calls (a new epoch, a triggered
        window) calls :meth:`StepHook.reschedule`.
        """
        ...


class SchedulesFetches(Protocol):
    """Optional: which calls have only their fetch timed (the light path: JAX, torch)."""

    def next_fetch(self, index: int) -> int | None:
        """The first call at or after ``index`` whose fetch alone is timed, or None.

        Asked only on a backend that times a fetch without a sync
        (``backend.fetch_caller``). Such a call adds its fetch to the pending
        record (``StepRecord.covered_fetch``) and is otherwise a fast call: no
        record, no sync, no ``around``.
        """
        ...


class WrapsSteps(Protocol):
    """Optional: a context around each call on the full path (profiler step markers, retrying a batch)."""

    def around(self, record: StepRecord, call: Callable[[], Any]) -> Any:
        """Runs ``call()`` (the fetch and the step) and returns its result."""
        ...


class ReplacesStep(Protocol):
    """Optional: the function every call runs, fast ones included."""

    def inner(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """What each call runs in place of ``fn``, with the same arguments.

        ``fn`` is Keras's train function or the previous observer's
        replacement; on TensorFlow's unsampled path it receives the
        ``tf.data`` iterator. Called again whenever an observer attaches or
        detaches, never per call.
        """
        ...


class NotifiedOnDetach(Protocol):
    """Optional: told when the hook lets go of the observer."""

    def on_detach(self, stale: bool) -> None:
        """The hook was removed; ``stale``: by a later fit(), after the fit that attached it died."""
        ...
