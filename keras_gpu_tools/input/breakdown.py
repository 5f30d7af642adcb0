"""Where the step goes: compilation and retraces apart, and the steady step split into its parts.

:class:`StepBreakdown` reads the step hook's records (only the calls that
leave the fast path: nothing is added per unmeasured step) and, once per
epoch, the framework's own trace counts of the train step. Per epoch it gives
:class:`EpochBreakdown`:

- ``compile_seconds``: the time of the calls that compiled or traced (the
  first call, a call with a batch shape not seen before) beyond a normal
  call: its duration less its fetch less ``steps * (compute + dispatch)`` of
  the epoch's steady step; past ``MAX_CALLS`` timed per epoch, each further
  one counts the mean of the timed retraces. A retrace the hook did not time
  (on the fast path) is counted by the framework; its time is the excess over
  the steady step of the untimed intervals that hold one (the longest, at
  most one per such retrace; an interval may hold several). The steady step
  there is the mean of the untimed intervals that hold none, else of the
  sampled steady calls, else compute plus dispatch: never the epoch's own
  step, which holds the compilation.
- ``retraces``: traces of the train step beyond its first, from the
  framework (``tf.function``'s tracing count, the ``jax.jit`` cache size,
  torch.compile's graphs): exact, read once per epoch. Eager execution (torch
  without ``jit_compile``, ``run_eagerly``) compiles nothing: 0 and 0.
- the steady step, compilation left out (the epoch's :class:`Measurement`):
  input wait, host dispatch (where told apart: JAX on a GPU), device compute,
  collectives (several devices of one process: the all-reduce of the
  trainable weights, from the bus bandwidth of one all-reduce timed alone at
  fit start; else left out, with the reason), other (the rest, where compute
  is measured; else unknown: the step is then not split). The known parts add up to ``step``, the detector's
  step (``Measurement.step``, ``input/step_ms``), less the compile time of
  retraces on untimed calls (where the framework counts any): the one step
  time every view reads.

What is kept is bounded whatever the fit does: a retrace storm of thousands
of shapes keeps ``MAX_SHAPES`` of them and ``MAX_CALLS`` timed compile calls
per epoch; the counts stay exact.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any

from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.step_record import StepRecord

MAX_SHAPES = 16  # batch signatures kept per fit for the advice (the count stays exact)
MAX_CALLS = 256  # compile calls timed per epoch; later ones are counted, their time estimated
MAX_INTERVALS = 256  # the largest untimed intervals kept per epoch (for retraces the hook did not time)


@dataclasses.dataclass
class EpochBreakdown:
    """One epoch's step breakdown (times per step in seconds, compilation in seconds for the epoch)."""

    compile_seconds: float | None = None
    retraces: int | None = None
    input: float | None = None
    dispatch: float | None = None
    compute: float | None = None
    collective: float | None = None
    other: float | None = None
    step: float | None = None
    steps: int = 0
    collective_reason: str | None = None  # why `collective` is left out, where it is

    def parts(self) -> dict[str, float]:
        """The steady parts that are known, by name (they add up to ``step`` where compute is known)."""
        names = ("input", "dispatch", "compute", "collective", "other")
        return {n: v for n in names if (v := getattr(self, n)) is not None}

    def logs(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.compile_seconds is not None:
            out[schema.STEP_COMPILE_SECONDS] = float(self.compile_seconds)
        if self.retraces is not None:
            out[schema.STEP_RETRACES] = float(self.retraces)
        keys = {
            "input": schema.STEP_INPUT_MS,
            "dispatch": schema.STEP_DISPATCH_MS,
            "compute": schema.STEP_COMPUTE_MS,
            "collective": schema.STEP_COLLECTIVE_MS,
            "other": schema.STEP_OTHER_MS,
            "step": schema.STEP_STEP_MS,
        }
        for name, key in keys.items():
            v = getattr(self, name)
            if v is not None and math.isfinite(v):
                out[key] = float(v) * 1e3
        return out


def traces_added(before: dict[int, int] | None, after: dict[int, int] | None) -> tuple[int, int] | None:
    """(new traces, of which retraces) between two readings of the framework's trace counts, by function.

    A function's first trace is its compilation, every later one a retrace.
    None where the framework gives no count.
    """
    if after is None:
        return None
    before = before or {}
    new = retraces = 0
    for fn, count in after.items():
        was = before.get(fn, 0)
        if count > was:
            new += count - was
            retraces += count - max(was, 1)
    return new, retraces


def allreduce_seconds(param_bytes: float, devices: int, bandwidth: float | None) -> float | None:
    """A ring all-reduce of ``param_bytes`` over ``devices``: ``2 (n - 1) / n * bytes / bandwidth`` (bus bytes/s)."""
    if devices < 2 or not bandwidth or not param_bytes:
        return None
    return 2.0 * (devices - 1) / devices * param_bytes / bandwidth


class StepBreakdown:
    """One fit's compile calls, retraces and steady step parts; fed records, closed once per epoch.

    Args:
        compiles: whether the train step is compiled or traced (False: eager
            torch, ``run_eagerly``). Defaults to `True`.
        devices: devices that run one step. Defaults to `1`.
        allreduce_bytes: bytes all-reduced per step (the trainable weights),
            where several devices run it. Defaults to `None`.
        bandwidth: bus bandwidth of an all-reduce over the step's devices,
            bytes/s (``2 (n - 1) / n * bytes / seconds``), where measured.
            Defaults to `None`.
        traces: the framework's trace counts at the start of the fit.
            Defaults to `None`.
    """

    def __init__(
        self,
        compiles: bool = True,
        devices: int = 1,
        allreduce_bytes: float | None = None,
        bandwidth: float | None = None,
        traces: dict[int, int] | None = None,
    ):
        self.compiles = compiles
        self.devices = max(int(devices), 1)
        self.allreduce_bytes = allreduce_bytes
        self.bandwidth = bandwidth
        self._traces = traces
        self.shapes: list[Any] = []  # the batch signatures of timed compile calls, first MAX_SHAPES
        self.signatures_seen = 0  # distinct signatures among them (exact)
        self._signatures_before = 0
        self._seen: set[Any] = set()  # at most MAX_SHAPES + 1 of them
        self.epochs: list[EpochBreakdown] = []
        self.compile_seconds = 0.0  # the fit's
        self.first_call_seconds = 0.0  # of which the fit's first call
        self.retraces = 0
        self.compile_line: str | None = None  # the backend's persistent compilation cache, for the advice
        self.collective_how: str | None = None  # how `bandwidth` was measured, or why it was not
        # Whether a GPU of the step has tensor cores (compute capability 7.0 or later); None: not known.
        # Mixed precision is advised only where it can pay: never on a CPU.
        self.tensor_cores: bool | None = None
        self._reset()

    def _reset(self) -> None:
        self._calls: list[tuple[float, int, bool]] = []  # (seconds less fetch, steps, first call) of compile calls
        self._calls_dropped = 0
        self._dispatch_sum = 0.0
        self._dispatch_steps = 0
        self._intervals: list[tuple[float, int]] = []  # a min-heap of the longest untimed intervals
        self._untimed = [0.0, 0]  # every untimed interval's seconds and steps (exact)
        self._steady = [0.0, 0]  # the sampled steady calls' intervals: seconds and steps

    # -- per record (full-path calls only, on the training thread) -----------------------------
    def add(self, r: StepRecord) -> None:
        n = max(int(r.steps), 1)
        if r.warmup:
            if r.start is not None and r.end is not None:
                if len(self._calls) < MAX_CALLS:
                    self._calls.append((r.end - r.start - (r.fetch or 0.0), n, r.index == 0))
                else:
                    self._calls_dropped += 1
            if r.signature is not None:
                self._note_shape(r.signature)
            return
        if r.sampled and r.interval is not None and not r.covers:  # a steady step's wall time, fetch included
            self._steady[0] += r.interval
            self._steady[1] += n
        if r.sampled and r.dispatch is not None:
            self._dispatch_sum += r.dispatch
            self._dispatch_steps += n
        elif not r.sampled and r.interval is not None and self.compiles:
            item = (r.interval, n + max(int(r.covers), 0))
            self._untimed[0] += item[0]
            self._untimed[1] += item[1]
            if len(self._intervals) < MAX_INTERVALS:
                heapq.heappush(self._intervals, item)
            elif item > self._intervals[0]:
                heapq.heapreplace(self._intervals, item)

    def _note_shape(self, sig: Any) -> None:
        try:
            if sig in self._seen:
                return
        except TypeError:  # an unhashable signature
            return
        self.signatures_seen += 1
        if len(self._seen) <= MAX_SHAPES:
            self._seen.add(sig)
        if len(self.shapes) < MAX_SHAPES:
            self.shapes.append(sig)

    # -- per epoch -------------------------------------------------------------------------------
    def end_epoch(self, m: Measurement, traces: dict[int, int] | None) -> EpochBreakdown:
        """The epoch's breakdown from its steady figures ``m`` and the framework's trace counts now."""
        e = EpochBreakdown(steps=m.steps)
        dispatch = self._dispatch_sum / self._dispatch_steps if self._dispatch_steps else None
        inside = 0.0  # compile seconds inside the steady calls' intervals (retraces on untimed calls)
        if self.compiles:
            counted = traces_added(self._traces, traces)
            if traces is not None:
                self._traces = traces
            seconds, inside, e.retraces = self._compile(m, dispatch, counted)
            e.compile_seconds = float(seconds)
        else:
            e.compile_seconds, e.retraces = 0.0, 0  # nothing compiles
        self._split(e, m, dispatch, inside)
        self.compile_seconds += e.compile_seconds or 0.0
        self.retraces += e.retraces or 0
        self.epochs.append(e)
        self._reset()
        return e

    def _compile(
        self, m: Measurement, dispatch: float | None, counted: tuple[int, int] | None
    ) -> tuple[float, float, int]:
        """(compile seconds, of which inside untimed calls' intervals, retraces) of the epoch."""
        normal = (m.compute or 0.0) + (dispatch or 0.0)  # a steady call's time per step, fetch left out
        timed = len(self._calls) + self._calls_dropped
        excess = [(max(0.0, s - k * normal), first) for s, k, first in self._calls]
        self.first_call_seconds += sum(x for x, first in excess if first)
        seconds = sum(x for x, _ in excess)
        later = [x for x, first in excess if not first]  # calls past MAX_CALLS are retraces: their mean each
        if self._calls_dropped and (later or excess):
            seconds += self._calls_dropped * sum(later or [x for x, _ in excess]) / len(later or excess)
        if counted is None:  # no count from the framework: the new shapes the hook timed, less the first
            return seconds, 0.0, max(0, self.signatures_seen - max(self._signatures_counted_before(), 1))
        new, retraces = counted
        inside = self._inside(new - timed, normal)
        return seconds + inside, inside, retraces

    def _inside(self, untimed: int, normal: float) -> float:
        """Compile seconds of ``untimed`` traces on fast-path calls: their intervals' excess over a steady step."""
        if untimed <= 0 or not self._intervals:
            return 0.0
        kept = sorted(self._intervals, reverse=True)
        top = kept[:untimed]  # at most one interval per trace holds it; one may hold several
        rest = (self._untimed[0] - sum(i for i, _ in top), self._untimed[1] - sum(k for _, k in top))
        if untimed <= len(kept) and rest[1] > 0:  # the intervals that hold no trace: the fast path's step
            base = max(rest[0], 0.0) / rest[1]
        elif self._steady[1]:  # the sampled steady calls (synced: a little longer than the fast path)
            base = self._steady[0] / self._steady[1]
        else:
            base = normal
        inside = sum(max(0.0, i - k * base) for i, k in top)
        if untimed > len(kept) and rest[1] > 0:  # the intervals not kept may hold traces too: their excess, summed
            inside += max(0.0, rest[0] - rest[1] * base)
        return inside

    def _signatures_counted_before(self) -> int:
        before, self._signatures_before = self._signatures_before, self.signatures_seen
        return before

    def _split(self, e: EpochBreakdown, m: Measurement, dispatch: float | None, inside: float = 0.0) -> None:
        # The step is the detector's (`input/step_ms`): the intervals between calls tile the wall time, the
        # compile calls' left out; the compile time `inside` the others' (retraces on untimed calls) too.
        step = m.step
        if not step:
            return
        step = max(step - inside / max(m.steps, 1), 0.0) if inside else step
        e.step, e.input = step, min(m.wait, step) if m.wait is not None else None
        compute = min(m.compute, step - (e.input or 0.0)) if m.compute is not None else None
        if dispatch is not None:  # host time the detector's `other` holds: carved out of it
            e.dispatch = min(dispatch, max(0.0, step - (e.input or 0.0) - (compute or 0.0)))
        if self.devices > 1:  # (one device: no all-reduce, nothing left out)
            compute = self._collective(e, compute)
        e.compute = compute
        if compute is None:  # the rest is compute and host time together: neither is known, `other` is left out
            return
        known = sum(v for v in (e.input, e.dispatch, e.compute, e.collective) if v is not None)
        e.other = max(0.0, step - known)  # the rest of the measured step: callbacks, Python

    def _collective(self, e: EpochBreakdown, compute: float | None) -> float | None:
        """Sets the epoch's collectives (or why they are left out); returns compute without them."""
        if not self.allreduce_bytes:
            e.collective_reason = "the trainable weights' bytes are unknown"
            return compute
        e.collective = allreduce_seconds(self.allreduce_bytes, self.devices, self.bandwidth)
        if e.collective is None:
            why = self.collective_how or "the interconnect's bandwidth is unknown"
            e.collective_reason = (
                f"{why}: the all-reduce moves {self.allreduce_bytes / 2**20:.1f} MiB per step, inside compute"
            )
        elif compute is not None:
            e.collective = min(e.collective, compute)
            compute -= e.collective
        return compute
