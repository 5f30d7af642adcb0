"""Out-of-memory recovery without a model: the retry loop, and the message when nothing fits.

Nothing here knows about Keras or imports a framework; recognising a backend's
out-of-memory error is the backends' job (``keras_gpu_tools.backends.oom_kind``),
handed to :class:`Recovery` as ``classify``. The split of each attempt comes
from :class:`~keras_gpu_tools.memory.split.SplitController`; :func:`final_message`
explains what was tried when nothing fits.
"""

from __future__ import annotations

import enum
import gc
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from keras_gpu_tools.errors import InexactAccumulationError, OutOfMemoryError, UnrecoverableOOM
from keras_gpu_tools.memory.agreement import Agreement
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.freeing import free_failed_step, held_since, in_use, older_frozen
from keras_gpu_tools.memory.runners import Runner
from keras_gpu_tools.memory.split import SplitController, describe_split, split_sizes
from keras_gpu_tools.runtime.units import format_bytes

logger = logging.getLogger("keras_gpu_tools")


def final_message(
    tried: Sequence[tuple[int, int]],
    min_batch_size: int,
    memory: dict[str, Any] | None = None,
    original: BaseException | None = None,
    granule: int = 1,
) -> str:
    """The message of the error raised when even the smallest split runs out of memory."""
    g = max(1, granule)
    tried_txt = ", ".join(f"{n} as {describe_split(n, k, g)}" if k > 1 else f"{n}" for n, k in tried)
    # Say what the last attempt ran, which is not always `min_batch_size`: a
    # batch smaller than it is never split, and an uneven split runs smaller ones.
    n, k = tried[-1]
    unsplit = k == 1 and n > 1
    per_device = g > 1 and n // g <= k  # one sample per data-parallel device: no smaller split exists
    if unsplit and per_device:
        what = f"at the whole batch of {n}, one sample per device of the {g} data-parallel devices"
    elif unsplit:
        what = f"at the whole batch of {n}; min_batch_size={min_batch_size} allows no split of it"
    elif k == 1:
        what = f"at a batch of 1 (min_batch_size={min_batch_size})"
    else:
        sizes = split_sizes(n, k, g)
        size = str(sizes[0]) if len(set(sizes)) == 1 else f"at most {sizes[0]}"
        what = f"even at micro-batches of {size} ({n} as {describe_split(n, k, g)}; min_batch_size={min_batch_size})"
    lines = [f"OOMBatchSizeReducer: out of memory {what}. Batch sizes tried: {tried_txt}."]
    if memory and (figures := _memory_figures(memory)):
        lines.append(f"Device memory: {figures}.")
    smallest = min(split_sizes(n, k, g))
    held_by_minimum = not per_device and not unsplit and k > 1 and math.ceil(n / k) > max(1, min_batch_size)
    if per_device:
        lines.append(
            f"Under data parallelism over {g} devices each micro-batch holds at least one sample per device "
            f"({g} samples), so {n} cannot be split further. Use fewer samples per device with more devices, "
            "or the remedies below."
        )
    if held_by_minimum:
        lines.append(
            f"min_batch_size={min_batch_size} allows no smaller split of {n}: a largest micro-batch below "
            f"{math.ceil(n / k)} would leave some micro-batches below {min_batch_size} (the smallest tried was "
            f"{smallest}). Lower `min_batch_size` to let OOMBatchSizeReducer go further."
        )
    if unsplit and not per_device:
        lines.append(
            f"The batch was not split: lower `min_batch_size` below {n} to let OOMBatchSizeReducer retry it as "
            "micro-batches, or lower the batch size. If smaller batches do not fit either, use mixed precision "
            "(keras.mixed_precision.set_global_policy('mixed_bfloat16' or 'mixed_float16')), a smaller model or "
            "shorter inputs, or rematerialisation (keras.config.set_remat / keras.RematScope)."
        )
    elif not held_by_minimum:
        lines.append(
            "Even one micro-batch does not fit: the model itself (weights, optimizer state, one micro-batch's "
            "activations) needs more memory than the device has. What to do: use mixed precision "
            "(keras.mixed_precision.set_global_policy('mixed_bfloat16' or 'mixed_float16')), a smaller model or "
            "shorter inputs, rematerialisation (keras.config.set_remat / keras.RematScope) to trade compute for "
            "activation memory, or a device with more memory."
        )
    if original is not None:
        text = [ln.strip() for ln in str(original).strip().splitlines() if ln.strip()]
        keys = ("out of memory", "can't allocate memory", "oom when allocating", "resource_exhausted")
        memory_lines = [ln for ln in text if any(k in ln.lower() for k in keys)]
        first = (memory_lines or text or [type(original).__name__])[0]
        lines.append(f"Last error: {type(original).__name__}: {first[:300]}")
    return "\n".join(lines)


def _memory_figures(memory: dict[str, Any]) -> str:
    """The device's memory figures of the final message, in words ("" where it has none)."""
    parts = []
    for key, label in (
        ("device", "device"),
        ("bytes_limit", "memory limit"),
        ("bytes_in_use", "in use"),
        ("peak_bytes_in_use", "peak"),
        ("needed_bytes", "the step needs about"),
    ):
        if memory.get(key) is not None:
            value = memory[key]
            parts.append(f"{label} {format_bytes(value) if key != 'device' else value}")
    return ", ".join(parts)


def smallest_failing(explanation: dict[str, Any] | None, before: int | None, micro: int) -> int | None:
    """The smallest micro-batch that certainly runs out of memory too, from a real error's figures; or None.

    When an attempt at micro-batches of ``micro`` failed, what it had allocated
    (in use at the error, less ``before``, in use before it) plus what it asked
    for is less than what it needed. Its need grows at most in proportion to
    the micro-batch (activations grow with it, the rest does not), so a
    micro-batch of ``m`` needs at least that times ``m / micro``; where that
    is over the room the device had (its capacity less ``before``, with a
    tenth to spare for what is not proportional) it cannot fit. Needs the
    figures a GPU's allocator gives; None elsewhere, or where nothing is certain.
    """
    e = explanation or {}
    asked, held, capacity = e.get("requested_bytes"), e.get("in_use_bytes"), e.get("capacity_bytes")
    if not asked or held is None or not capacity or before is None:
        return None
    least = int(held) - before + int(asked)  # what the failed attempt needed at least
    room = 1.1 * (int(capacity) - before)
    if least <= room or room <= 0:
        return None
    return math.floor(room * micro / least) + 1


def certain_explanation(n: int, k: int, floor: int, granule: int = 1) -> dict[str, Any]:
    """The explanation of a split skipped because a real error's figures already say it cannot fit."""
    note = (
        f"not run: {n} as {describe_split(n, k, granule)} needs at least what the last real error showed, scaled "
        f"to its micro-batches, which is more than the device holds (micro-batches of {floor} or more cannot fit)"
    )
    return {"notes": [note], "lines": [note], "sources": ["the last out-of-memory error's figures"]}


class Laps:
    """The seconds of each named part of an attempt: ``lap(name)`` ends the part called ``name``."""

    def __init__(self, clock: Callable[[], float], start: float):
        self.clock = clock
        self.last = start
        self.phases: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = self.clock()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


class Stage(enum.Enum):
    """Where :meth:`Recovery.run`'s loop over the splits of one batch stands."""

    ATTEMPT = "attempt"  # a new split: agreed with the job, ruled out or predicted, then one of the five below
    REFUSED = "refused"  # some process of the job cannot fit it: not run
    RULED_OUT = "ruled out"  # the last real error's figures say it cannot fit: not run
    PREDICTED = "predicted"  # the runner's memory analysis says it cannot fit: not run
    RUN = "run"  # run it: DONE, or RESTORE after an out-of-memory error
    RESTORE = "restore"  # what the failed step holds is freed, the state put back
    RECORD = "record"  # the failed attempt's event; the next split, or GAVE_UP
    DONE = "done"  # terminal: the split ran; the loop returns its result
    GAVE_UP = "gave up"  # terminal: no smaller split is allowed; the loop raises


TERMINAL = frozenset({Stage.DONE, Stage.GAVE_UP})


@dataclass
class Attempt:
    """What one attempt at a split found out (a new one for each split)."""

    guarded: bool  # the first run of this split at this batch shape, or a regrow trial
    trial: bool  # a regrow trial
    t0: float
    lap: Laps  # the seconds of each part of the attempt, for the event
    context: dict[str, Any]  # for `explain`
    agreed: Agreement | None = None  # what the job's processes agreed, where they were asked
    certain: bool = False  # ruled out by the last real error's figures
    predicted: bool | None = None  # the runner's prediction, where it was asked
    failure: BaseException | None = None  # this attempt's out-of-memory error, where it had one
    explanation: dict[str, Any] | None = None
    snap: Any = None  # the runner's copy of the state while the split runs
    before: int | None = None  # the device's bytes in use before the run
    result: Any = None  # the run's result (DONE)
    event: OOMEvent | None = None  # the failed attempt's event (RECORD)


@dataclass
class RetryState:
    """The loop over the splits of one batch: its inputs, and what outlives each attempt."""

    runner: Runner
    batch: Any
    n: int
    signature: Any
    step: int
    state: Any  # the training state; put back after each failed run
    k: int  # the split of the current attempt
    job: bool  # a step of a job of several processes: each guarded attempt is agreed
    predicting: bool = False  # ask the runner's prediction before guarded attempts
    tried: list[tuple[int, int]] = field(default_factory=list)  # (n, k) of each failed attempt
    real: BaseException | None = None  # the last real out-of-memory error of this batch
    floor: int | None = None  # after a real error: micro-batches this large certainly fail too (smallest_failing)
    attempt: Attempt = field(init=False)


class Recovery:
    """Runs one batch with retries; the backend work is done by ``runner``.

    ``runner`` has ``run(batch, n, k, state, guarded)``, ``protect(state,
    guarded)``, ``restore(snapshot, state)`` and, optionally,
    ``predict(batch, n, k, state) -> (fits, bytes_needed)`` (see
    ``memory/accumulate.py``). An attempt is *guarded* the first time a split runs at a
    batch shape, and for regrow trials: then the runner keeps a full copy of
    the state and (JAX) waits for the step to finish inside the attempt.

    Args:
        controller: the :class:`SplitController`.
        on_event: called with each :class:`OOMEvent`.
        memory: returns the device's memory figures for the final message.
        clock: a monotonic clock.
        probe: ask ``runner.predict`` before guarded attempts and skip the
            ones predicted not to fit.
    """

    def __init__(
        self,
        controller: SplitController,
        on_event=None,
        memory=None,
        clock=None,
        probe: bool = False,
        classify: Callable[[BaseException], str | None] | None = None,
        rebuild: Callable[[BaseException, str], BaseException] | None = None,
        explain: Callable[[BaseException | None, dict[str, Any]], dict[str, Any] | None] | None = None,
    ):
        import time

        self.classify = classify or (lambda e: None)
        self.explain = explain or (lambda e, context: None)
        self.rebuild = rebuild or (lambda e, message: OutOfMemoryError(message))
        self.controller = controller
        self.on_event = on_event or (lambda e: None)
        self.memory: Callable[[], dict[str, Any]] = memory or (lambda: {})
        self.clock = clock or time.perf_counter
        self.probe = probe
        self.phase = "train"
        # After a real out-of-memory error, ask the runner's memory analysis (JAX) before running the next
        # splits, so those that cannot fit are neither compiled for running nor run (False: every failing
        # split is compiled and run, for comparison in benchmarks).
        self.predict_after_oom = True
        # A collection of every object (a large fraction of a second with a framework imported) runs
        # after a failure only while one has ever freed something: see `_collect_all`.
        self.deep_collect = True
        self.known: set[tuple[Any, int]] = set()  # (signature, k) that ran without error
        self.last_need: int | None = None
        self.restored_state = None

        # A job of several processes: ``agree(runner, batch, n, k, state) -> Agreement`` before each
        # guarded attempt of a step of the job (``runner.spans_processes(batch)``, where the runner
        # tells); a split that does not fit on some process runs nowhere (see Agreement). A step on
        # this process's own data (a predict() on one process) runs and retries alone.
        self.agree: Callable[..., Agreement] | None = None

    def _collect_all(self) -> None:
        """A full garbage collection; where it frees nothing, later failures skip it.

        What a failed step still holds after its own cycles were collected is either in a cycle
        through older objects (freed here) or live: the batch on the device, the allocator's own
        memory. A collection that freed nothing says it is live, and will be again.
        """
        held = in_use(self.memory)
        gc.collect()
        now = in_use(self.memory)
        if held is not None and now is not None and now > held - 64 * 2**20:
            self.deep_collect = False
            logger.debug(
                "keras_gpu_tools: a full collection freed nothing after an out-of-memory error; skipped from now"
            )

    def run(self, runner, batch, n: int, signature, state=None, step: int = 0):
        """Runs ``batch`` (``n`` samples), split finer after each out-of-memory error; returns ``(result, k)``.

        A small state machine (:class:`Stage`): each attempt at a split ends in one of five
        outcomes (it ran; refused by the job; ruled out by a real error's figures; predicted not
        to fit; ran out of memory), and every one but the first is recorded as an
        :class:`OOMEvent` before the next split, or the error when no smaller split is allowed.
        """
        k = self.controller.split_for(n)
        self.restored_state = None
        # A step of the job (its batch spread over several processes' devices), not this process's own one.
        job = self.agree is not None and getattr(runner, "spans_processes", lambda b: True)(batch)
        loop = RetryState(runner, batch, n, signature, step, state=state, k=k, job=job)
        loop.predicting = self.probe  # after a real out-of-memory error too: ask before running the next split
        stage = Stage.ATTEMPT
        while stage not in TERMINAL:
            stage = TRANSITIONS[stage](self, loop)
        if stage is Stage.GAVE_UP:
            self._give_up(loop)
        return loop.attempt.result, loop.k

    def _attempt(self, loop: RetryState) -> Stage:
        """A new split: agreed with the job's other processes, ruled out, or predicted; then its outcome."""
        ctl = self.controller
        guarded = (loop.signature, loop.k) not in self.known or ctl.in_trial
        trial = ctl.in_trial
        t0 = self.clock()
        context = {
            "runner": loop.runner,
            "batch": loop.batch,
            "n": loop.n,
            "k": loop.k,
            "state": loop.state,
            "step": loop.step,
        }
        # `lap` keeps the seconds of each part of the attempt, for the event.
        a = loop.attempt = Attempt(guarded=guarded, trial=trial, t0=t0, lap=Laps(self.clock, t0), context=context)
        agree = self.agree
        a.agreed = (
            agree(loop.runner, loop.batch, loop.n, loop.k, loop.state)
            if agree is not None and guarded and loop.job
            else None
        )
        if a.agreed is not None:
            a.lap("agree")
        a.certain = a.agreed is None and loop.floor is not None and -(-loop.n // loop.k) >= loop.floor
        if a.certain:
            a.predicted = False  # the last real error's figures already say it cannot fit: neither run nor analysed
        elif a.agreed is None and guarded and loop.predicting and hasattr(loop.runner, "predict"):
            a.predicted, self.last_need = loop.runner.predict(loop.batch, loop.n, loop.k, loop.state)
            a.lap("predict")
        if a.agreed is not None and not a.agreed.fits:
            return Stage.REFUSED
        if a.certain:
            return Stage.RULED_OUT
        if a.predicted is False:
            return Stage.PREDICTED
        return Stage.RUN

    def _refused(self, loop: RetryState) -> Stage:
        """Some process of the job cannot fit the split: it runs nowhere."""
        a = loop.attempt
        assert a.agreed is not None
        a.failure = a.agreed.error  # this process's own error, or None where another's ran out
        a.explanation = a.agreed.explanation
        return Stage.RECORD

    def _ruled_out(self, loop: RetryState) -> Stage:
        """The last real error's figures say the split cannot fit: neither run nor analysed."""
        loop.attempt.explanation = certain_explanation(loop.n, loop.k, loop.floor or 0, self.controller.granule)
        return Stage.RECORD

    def _predicted(self, loop: RetryState) -> Stage:
        """The runner's memory analysis says the split cannot fit: not run."""
        a = loop.attempt
        a.explanation = self.explain(None, dict(a.context, predicted_need=self.last_need))
        a.lap("explain")
        return Stage.RECORD

    def _run(self, loop: RetryState) -> Stage:
        """Runs the split: DONE where it fits; after an out-of-memory error, what the failed step held is freed."""
        a, runner = loop.attempt, loop.runner
        a.snap = runner.protect(loop.state, a.guarded)
        a.before = in_use(self.memory) if a.guarded else None  # what a failure leaves held is measured against
        a.lap("protect")
        with older_frozen(a.guarded):  # a full collection of the failure's cycles costs milliseconds
            try:
                result = runner.run(loop.batch, loop.n, loop.k, loop.state, a.guarded)
            except InexactAccumulationError:
                # Refused before the update was applied: put back what the micro-batches changed.
                self.restored_state = runner.restore(a.snap, loop.state)
                raise
            except Exception as e:
                if self.classify(e) is None:
                    raise  # not ours: unchanged, with its traceback
                if loop.job:
                    raise UnrecoverableOOM(
                        "OOMBatchSizeReducer: out of memory in a step of a job of several processes, after every "
                        f"process had fitted this split ({loop.n} as {describe_split(loop.n, loop.k, self.controller.granule)}) in its "
                        "rehearsal. The other processes may be waiting in the step's collective for this one "
                        "(they do not time out: a CPU job over gloo waits for good), so it cannot be retried; "
                        "stop the whole job. Lower the batch size, or set `plan=` to a micro-batch size with "
                        "headroom."
                    ) from e
                failure = a.failure = e
                loop.predicting = loop.predicting or self.predict_after_oom
                a.lap("run")
                try:  # while the failed step's memory is still held: the allocator's view of it
                    a.explanation = self.explain(e, a.context)
                except Exception:
                    logger.debug("keras_gpu_tools: explaining the out-of-memory error failed", exc_info=True)
                    a.explanation = None
                a.lap("explain")
            else:
                self.known.add((loop.signature, loop.k))
                self.controller.on_success(loop.n, loop.k)
                a.result = result
                return Stage.DONE
            # Outside the except block, where the failed step's frames no longer run.
            free_failed_step(failure, held_since(self.memory, a.before))
        return Stage.RESTORE

    def _restore(self, loop: RetryState) -> Stage:
        """After an out-of-memory error: what is still held is collected, and the state put back."""
        a = loop.attempt
        if self.deep_collect and held_since(self.memory, a.before)():
            self._collect_all()  # still held, maybe by a cycle through older objects: all of them
        a.lap("free")
        try:
            loop.state = loop.runner.restore(a.snap, loop.state)
        except UnrecoverableOOM as u:
            raise u from a.failure
        a.lap("restore")
        self.restored_state = loop.state  # the state from before the failed attempt
        a.snap = None
        loop.floor = smallest_failing(a.explanation, a.before, -(-loop.n // loop.k))
        loop.real = a.failure
        return Stage.RECORD

    def _record(self, loop: RetryState) -> Stage:
        """The failed attempt's event; then the next split, or GAVE_UP where no smaller one is allowed."""
        ctl, a = self.controller, loop.attempt
        loop.tried.append((loop.n, loop.k))
        nxt = ctl.on_oom(loop.n, loop.k)
        if a.agreed is not None and not a.agreed.fits:
            kind = a.agreed.kind
        else:
            # An error gets here only where `classify` recognised it.
            kind = (self.classify(a.failure) or "unknown") if a.failure is not None else "predicted"
        a.event = event = OOMEvent(
            step=loop.step,
            batch_size=loop.n,
            failed_split=loop.k,
            next_split=nxt,
            kind=kind,
            regrow=a.trial,
            seconds=self.clock() - a.t0,
            phase=self.phase,
            explanation=a.explanation,
            granule=ctl.granule,
            phases={name: round(v, 6) for name, v in a.lap.phases.items()},
        )
        logger.debug("keras_gpu_tools: %s; seconds: %s", event.line(), event.phases)
        self.on_event(event)
        if nxt is None:
            return Stage.GAVE_UP
        loop.k = nxt
        return Stage.ATTEMPT

    def _give_up(self, loop: RetryState) -> NoReturn:
        """Raises the error of a batch that runs out of memory at every split allowed."""
        ctl, a = self.controller, loop.attempt
        memory = dict(self.memory() or {})
        if self.last_need is not None:
            memory.setdefault("needed_bytes", self.last_need)
        message = final_message(loop.tried, max(1, ctl.min_batch_size), memory, a.failure, ctl.granule)
        why = a.event.why() if a.event is not None else []
        if why:
            message += "\nWhy: " + "\n     ".join(why)
        if a.agreed is not None and not a.agreed.fits and a.failure is None:
            raise OutOfMemoryError(message + f"\n({a.agreed.note})")
        if a.certain and loop.real is not None:  # the last real error, of its own type
            raise self.rebuild(loop.real, message + "\n(The last splits were not run: see Why.)") from loop.real
        if a.failure is None:
            raise OutOfMemoryError(message + "\n(Predicted from the compiled step's memory analysis; not run.)")
        raise self.rebuild(a.failure, message) from a.failure


# What runs each stage that is not terminal; it returns the next stage. Looked up at each step of the loop.
TRANSITIONS: dict[Stage, Callable[[Recovery, RetryState], Stage]] = {
    Stage.ATTEMPT: Recovery._attempt,
    Stage.REFUSED: Recovery._refused,
    Stage.RULED_OUT: Recovery._ruled_out,
    Stage.PREDICTED: Recovery._predicted,
    Stage.RUN: Recovery._run,
    Stage.RESTORE: Recovery._restore,
    Stage.RECORD: Recovery._record,
}
