"""Out-of-memory recovery without a model: the split policy, the retry loop, the messages.

Nothing here knows about Keras or imports a framework; recognising a backend's
out-of-memory error is the backends' job (``keras_gpu_tools.backends.oom_kind``),
handed to :class:`Recovery` as ``classify``. :class:`SplitController` decides in
how many micro-batches a batch runs: after an out-of-memory error the split
doubles (2, 4, 8, ...) until a micro-batch would be smaller than
``min_batch_size``; later batches start at the micro-batch size that worked;
with ``regrow_after`` a smaller split is tried again after that many good
steps. :func:`final_message` explains what was tried when nothing fits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools.errors import (  # noqa: F401 - re-exported
    InexactAccumulationError,
    OutOfMemoryError,
    UnrecoverableOOM,
)

logger = logging.getLogger("keras_gpu_tools")


def split_sizes(n: int, k: int, granule: int = 1) -> list[int]:
    """Sizes of ``k`` micro-batches of a batch of ``n`` (as even as possible, larger first).

    Under data parallelism over ``granule`` devices (or replicas) each
    device's share of the batch is split, so every micro-batch is a multiple
    of ``granule``: ``granule`` times the split of ``n / granule``.
    """
    if n < 1 or k < 1:
        raise ValueError(f"split_sizes needs n >= 1 and k >= 1, got n={n}, k={k}")
    if granule > 1 and n % granule == 0:
        return [granule * size for size in split_sizes(n // granule, k)]
    k = min(k, n)
    q, r = divmod(n, k)
    return [q + 1] * r + [q] * (k - r)


def describe_split(n: int, k: int, granule: int = 1) -> str:
    sizes = split_sizes(n, k, granule)
    if len(set(sizes)) == 1:
        return f"{len(sizes)} x {sizes[0]}"
    counts: dict[int, int] = {}
    for s in sizes:
        counts[s] = counts.get(s, 0) + 1
    return " + ".join(f"{c} x {s}" for s, c in sorted(counts.items(), reverse=True))


@dataclass
class OOMEvent:
    """One out-of-memory error that was recovered from (or not)."""

    step: int  # global step (train-function call) of the failed attempt
    batch_size: int
    failed_split: int  # micro-batches in the attempt that failed
    next_split: int | None  # the split tried next (None: gave up)
    kind: str  # backend of the error
    regrow: bool = False  # the failed attempt was a regrow trial
    seconds: float = 0.0  # time of the failed attempt
    phase: str = "train"  # "train", "test" (evaluate() and validation) or "predict"
    explanation: dict[str, Any] | None = None  # why (OOMExplanation.as_dict()), where it could be told
    granule: int = 1  # data-parallel devices (replicas): each one's share is split, see split_sizes

    def why(self) -> list[str]:
        """The explanation's readable lines (empty where none was recorded)."""
        return list((self.explanation or {}).get("lines") or [])

    def line(self) -> str:
        where = {"test": "evaluation step", "predict": "prediction step"}.get(self.phase, "step")
        what = f"out of memory at batch {self.batch_size}"
        if self.failed_split > 1:
            what += f" (as {describe_split(self.batch_size, self.failed_split, self.granule)})"
        if self.kind == "predicted":
            what = "predicted " + what
        if self.next_split is None:
            return f"{where} {self.step}: {what}; no smaller split is allowed"
        if self.regrow:
            return f"{where} {self.step}: {what} while trying a smaller split; back to {describe_split(self.batch_size, self.next_split, self.granule)}"
        return (
            f"{where} {self.step}: {what}, retrying as {describe_split(self.batch_size, self.next_split, self.granule)}"
        )


class SplitController:
    """Chooses the split of each batch; knows nothing of models.

    The state is the micro-batch size that works (``None`` until an
    out-of-memory error). A batch of ``n`` runs as ``ceil(n / micro_size)``
    micro-batches, so the last, smaller batch of an epoch keeps the same
    micro-batch size. No micro-batch is ever smaller than ``min_batch_size``:
    where a batch cannot be split into micro-batches of at most
    ``micro_size`` that are all at least ``min_batch_size``, it runs as the
    fewest micro-batches that respect the minimum (or whole).

    Args:
        min_batch_size: the smallest micro-batch to try. Defaults to `1`.
        regrow_after: after this many good steps at a split, try half as many
            micro-batches again (a failure doubles the wait). `None` never
            regrows. Defaults to `None`.
        max_micro_size: the largest micro-batch known to fit (a batch-size
            plan): batches above it start split, and regrowing never goes
            past it. `None` for no limit. Defaults to `None`.
    """

    def __init__(self, min_batch_size: int = 1, regrow_after: int | None = None, max_micro_size: int | None = None):
        self.min_batch_size = max(1, int(min_batch_size))
        self.regrow_after = regrow_after
        self.max_micro_size = max_micro_size
        self.micro_size: int | None = None  # None: whole batches (or the plan's size)
        self._good_steps = 0
        self._regrow_wait = regrow_after
        self._trial_from: int | None = None  # micro size before a regrow trial
        self.granule = 1  # data-parallel devices: set per fit by the callback

    def _most(self, n: int) -> int:
        """The most micro-batches a batch of ``n`` may run as: each at least ``min_batch_size``, one sample per device."""
        return max(1, min(n // self.min_batch_size, n // max(1, self.granule)))

    def split_for(self, n: int) -> int:
        """Micro-batches for a batch of ``n`` (1 = unsplit), regrow trials included."""
        micro = self.micro_size if self.micro_size is not None else self.max_micro_size
        if micro is None or n <= micro:
            return 1
        return min(n, math.ceil(n / micro), self._most(n))

    def next_split(self, n: int, k: int) -> int | None:
        """The split to try after ``k`` micro-batches of a batch of ``n`` ran out of memory.

        Twice as many micro-batches, and in any case a largest micro-batch
        strictly smaller than the one that failed; None where that would
        need a micro-batch below ``min_batch_size``.
        """
        failed = math.ceil(n / k)  # the largest micro-batch of the failed attempt
        if failed <= 1:
            return None
        target = min(math.ceil(n / (2 * k)), failed - 1)  # the largest micro-batch at twice the split
        nxt = math.ceil(n / target)  # the fewest micro-batches with that largest one
        most = self._most(n)
        if nxt > most:
            # As small as the minimum allows, if that is still smaller than what failed.
            if math.ceil(n / most) >= failed:
                return None
            nxt = math.ceil(n / math.ceil(n / most))
        return nxt

    def on_oom(self, n: int, k: int) -> int | None:
        """Records a failure at ``k``; returns the next split, or None to give up."""
        self._good_steps = 0
        if self._trial_from is not None:  # a regrow trial failed: back to what worked
            self.micro_size = self._trial_from
            self._trial_from = None
            if self.regrow_after is not None:
                self._regrow_wait = 2 * (self._regrow_wait or self.regrow_after)
            return self.split_for(n)
        nxt = self.next_split(n, k)
        if nxt is not None:
            self.micro_size = math.ceil(n / nxt)
        return nxt

    def jump_to(self, n: int, k: int) -> None:
        """Sets the split of a batch of ``n`` to ``k``, chosen without running (a prediction)."""
        self._good_steps = 0
        self._trial_from = None
        self.micro_size = math.ceil(n / k) if k > 1 else self.micro_size

    @property
    def in_trial(self) -> bool:
        return self._trial_from is not None

    def on_success(self, n: int, k: int) -> None:
        if self._trial_from is not None:
            self._trial_from = None
            self._regrow_wait = self.regrow_after
        self._good_steps += 1
        if (
            self.regrow_after is not None
            and self.micro_size is not None
            and self._good_steps >= (self._regrow_wait or self.regrow_after)
        ):
            self._good_steps = 0
            grown = 2 * self.micro_size  # half as many micro-batches
            if self.max_micro_size is not None:
                grown = min(grown, self.max_micro_size)  # never past the plan
            if grown > self.micro_size:
                self._trial_from = self.micro_size
                self.micro_size = grown

    def reset(self) -> None:
        self.micro_size = None
        self._good_steps = 0
        self._regrow_wait = self.regrow_after
        self._trial_from = None


def format_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} TiB"  # pragma: no cover


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
    if memory:
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
        if parts:
            lines.append("Device memory: " + ", ".join(parts) + ".")
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


@dataclass
class Agreement:
    """What the processes of a job agreed about one attempt, before any of them ran it.

    In a job of several processes every step is one program over all their
    devices, with collectives: a process that runs out of memory before the
    collective leaves the others waiting in it for good (a real CPU job over
    gloo does; NCCL does the same). So each process first rehearses the attempt
    on one of its own devices, with no collective, and the outcomes are
    gathered through the job's coordination service (which needs no device
    memory); the attempt runs only where every process fits it.
    """

    fits: bool
    error: BaseException | None = None  # this process's own out-of-memory error in the rehearsal
    kind: str = "agreed"  # the event's kind on a process that did not run out of memory itself
    note: str = ""  # who ran out of memory, for the messages
    explanation: dict[str, Any] | None = None


class IdlePath:
    """The reducer's idle path, as the backend's train function reads it on every step.

    A batch whose ``batch_signature`` equals ``signature`` (a shape that already
    ran whole) runs Keras's own step through :meth:`run`, straight from the
    backend's train function, with no frame of the reducer's. ``signature``
    None: every batch takes the reducer's guarded path. ``failed(error,
    signature)`` is called on an error of the step and raises the refusal of
    an out-of-memory error; for any other error it ends the reducer's fit and
    returns, and the error goes on unchanged.

    ``free`` counts the next batches that run idle with no look at their
    tensors: where fit() cuts dense arrays into batches (Keras's ``ArrayDataAdapter``,
    a new pass each epoch), every batch of an epoch but the last has one
    shape, ``full``, and once a batch of that shape ran whole the epoch's
    other full batches need no check. The backend's train function runs such
    a batch inline, as :meth:`run` does but with a frame less (it costs
    microseconds a step on a loaded 2-core CPU): ``free -= 1``, the step in a
    ``try`` whose error goes to ``failed(error, full)``, ``steps += 1``. Only
    the backends that do (``Backend.counts_idle_batches``: JAX, torch) are
    given ``epoch_batches``; elsewhere ``free`` stays 0. A train step that
    other code runs from inside fit() (a callback's ``train_on_batch``) takes
    a free slot too: it runs as Keras's own step, unchecked, and the epoch's
    last full batch is then checked. Telling such a call apart would cost a
    frame lookup on every step.
    """

    __slots__ = ("signature", "steps", "failed", "free", "full", "epoch_batches", "epoch_start")

    def __init__(self, failed: Callable[[BaseException, tuple | None], None]):
        self.signature: tuple | None = None
        self.steps = 0  # training batches run, idle or not (the reducer counts its own there)
        self.failed = failed
        self.reset(None)

    def reset(self, epoch_batches: int | None) -> None:
        """A new fit(): nothing ran whole yet; ``epoch_batches`` as for :meth:`ran`."""
        self.signature = self.full = None
        self.free = 0
        self.epoch_batches = epoch_batches  # None: batch shapes are not known in advance
        self.epoch_start = self.steps

    def new_epoch(self) -> None:
        """The epoch's batches but its last run unchecked, once their shape ran whole."""
        self.epoch_start = self.steps
        self.free = self.epoch_batches - 1 if self.full is not None else 0

    def ran(self, signature: tuple, whole: bool) -> None:
        """A batch of ``signature`` ran on the guarded path (``steps`` not yet counting it), whole or not."""
        if whole:
            self.signature = signature
        n = self.epoch_batches
        position = self.steps - self.epoch_start
        if n is None or position >= n - 1:
            return  # shapes unknown in advance, or an epoch's last batch: maybe partial
        # One of the epoch's full batches: the rest of them run unchecked, or all checked.
        self.full = signature if whole else None
        self.free = n - 2 - position if whole else 0

    def run(self, step: Callable, *args):
        """Keras's ``step(*args)`` in a ``try``, counted."""
        try:
            out = step(*args)
        except Exception as e:
            self.failed(e, self.signature)
            raise
        self.steps += 1
        return out


@dataclass
class Counters:
    """Per-epoch and whole-fit counts of the callback."""

    events: int = 0
    micro_batch_steps: int = 0  # steps that ran split
    lost_seconds: float = 0.0  # failed attempts and restores
    history: list[OOMEvent] = field(default_factory=list)


def free_failed_step(exc: BaseException, held: Callable[[], bool | None] | None = None) -> None:
    """Frees the tensors a failed step still holds, before the retry asks for memory again.

    The frames of the error's traceback, and of every error chained to it,
    are cleared; then a garbage collection frees the frames no traceback
    shows. Keras drops its own frames from the traceback it re-raises, but
    they sit in reference cycles with the errors, and they hold the failed
    step's tensors: on an H100 (torch) a batch that fits as 4 micro-batches
    ran as 64, each retry failing within 40 ms.

    Those cycles are young (made as the error unwound), so the young
    generations are collected first (about a millisecond). A full collection
    took 0.3 s per failed attempt there, so it runs only where ``held()``
    says the failed step's memory is still allocated, or where nothing can
    tell (``held`` None, or returning None; see :func:`held_since`).
    """
    import gc
    import traceback

    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            try:
                traceback.clear_frames(e.__traceback__)
            except Exception:
                pass
        todo += [e.__cause__, e.__context__]
    gc.collect(1)
    try:
        still = None if held is None else held()
    except Exception:
        still = None
    if still is None or still:
        gc.collect()


def in_use(memory: Callable[[], dict[str, Any]]) -> int | None:
    """``bytes_in_use`` of a backend's ``device_memory()`` figures (None where it has none, e.g. a CPU)."""
    try:
        value = (memory() or {}).get("bytes_in_use")
    except Exception:
        return None
    return None if value is None else int(value)


def held_since(memory: Callable[[], dict[str, Any]], before: int | None) -> Callable[[], bool | None]:
    """For :func:`free_failed_step`: whether the device holds clearly more (64 MiB) than ``before`` bytes now."""

    def held() -> bool | None:
        now = in_use(memory)
        return None if now is None or before is None else now > before + 64 * 2**20

    return held


class Recovery:
    """Runs one batch with retries; the backend work is done by ``runner``.

    ``runner`` has ``run(batch, n, k, state, guarded)``, ``protect(state,
    guarded)``, ``restore(snapshot, state)`` and, optionally,
    ``predict(batch, n, k, state) -> (fits, bytes_needed)`` (see
    ``grad_accum``). An attempt is *guarded* the first time a split runs at a
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
        self.memory = memory or (lambda: {})
        self.clock = clock or time.perf_counter
        self.probe = probe
        self.phase = "train"
        # After a real out-of-memory error, ask the runner's memory analysis (JAX) before running the next
        # splits, so those that cannot fit are neither compiled for running nor run (False: the behaviour
        # before, kept for benchmarks/oom_gpu_proof.py's comparison).
        self.predict_after_oom = True
        self.known = set()  # (signature, k) that ran without error
        self.last_split = 1
        self.last_need: int | None = None
        self.restored_state = None
        # A job of several processes: ``agree(runner, batch, n, k, state) -> Agreement`` before each
        # guarded attempt of a step of the job (``runner.spans_processes(batch)``, where the runner
        # tells); a split that does not fit on some process runs nowhere (see Agreement). A step on
        # this process's own data (a predict() on one process) runs and retries alone.
        self.agree: Callable[..., Agreement] | None = None

    def run(self, runner, batch, n: int, signature, state=None, step: int = 0):
        ctl = self.controller
        k = ctl.split_for(n)
        tried: list[tuple[int, int]] = []
        self.restored_state = None
        predicting = self.probe  # after a real out-of-memory error too: ask before running the next split
        explanation = None
        # A step of the job (its batch spread over several processes' devices), not this process's own one.
        job = self.agree is not None and getattr(runner, "spans_processes", lambda b: True)(batch)
        while True:
            guarded = (signature, k) not in self.known or ctl.in_trial
            trial = ctl.in_trial
            failure: BaseException | None = None
            t0 = self.clock()
            predicted = None
            context = {"runner": runner, "batch": batch, "n": n, "k": k, "state": state, "step": step}
            agreed = self.agree(runner, batch, n, k, state) if guarded and job else None
            if agreed is None and guarded and predicting and hasattr(runner, "predict"):
                predicted, self.last_need = runner.predict(batch, n, k, state)
            if agreed is not None and not agreed.fits:
                failure = agreed.error  # this process's own error, or None where another's ran out
                explanation = agreed.explanation
            elif predicted is False:
                failure = None
                explanation = self.explain(None, dict(context, predicted_need=self.last_need))
            else:
                snap = runner.protect(state, guarded)
                before = in_use(self.memory) if guarded else None  # what a failure leaves held is measured against
                try:
                    result = runner.run(batch, n, k, state, guarded)
                except InexactAccumulationError:
                    # Refused before the update was applied: put back what the micro-batches changed.
                    self.restored_state = runner.restore(snap, state)
                    raise
                except Exception as e:
                    if self.classify(e) is None:
                        raise  # not ours: unchanged, with its traceback
                    if job:
                        raise UnrecoverableOOM(
                            "OOMBatchSizeReducer: out of memory in a step of a job of several processes, after every "
                            f"process had fitted this split ({n} as {describe_split(n, k, ctl.granule)}) in its "
                            "rehearsal. The other processes may be waiting in the step's collective for this one "
                            "(they do not time out: a CPU job over gloo waits for good), so it cannot be retried; "
                            "stop the whole job. Lower the batch size, or set `plan=` to a micro-batch size with "
                            "headroom."
                        ) from e
                    failure = e
                    predicting = predicting or self.predict_after_oom
                    try:  # while the failed step's memory is still held: the allocator's view of it
                        explanation = self.explain(e, context)
                    except Exception:
                        logger.debug("keras_gpu_tools: explaining the out-of-memory error failed", exc_info=True)
                        explanation = None
                else:
                    self.known.add((signature, k))
                    ctl.on_success(n, k)
                    self.last_split = k
                    return result, k
                # Outside the except block, where the failed step's frames no longer run.
                free_failed_step(failure, held_since(self.memory, before))
                try:
                    state = runner.restore(snap, state)
                except UnrecoverableOOM as u:
                    raise u from failure
                self.restored_state = state  # the state from before the failed attempt
                snap = None
            tried.append((n, k))
            nxt = ctl.on_oom(n, k)
            if agreed is not None and not agreed.fits:
                kind = agreed.kind
            else:
                kind = self.classify(failure) if failure is not None else "predicted"
            event = OOMEvent(
                step=step,
                batch_size=n,
                failed_split=k,
                next_split=nxt,
                kind=kind,
                regrow=trial,
                seconds=self.clock() - t0,
                phase=self.phase,
                explanation=explanation,
                granule=ctl.granule,
            )
            self.on_event(event)
            if nxt is None:
                memory = dict(self.memory() or {})
                if self.last_need is not None:
                    memory.setdefault("needed_bytes", self.last_need)
                message = final_message(tried, max(1, ctl.min_batch_size), memory, failure, ctl.granule)
                if event.why():
                    message += "\nWhy: " + "\n     ".join(event.why())
                if agreed is not None and not agreed.fits and failure is None:
                    raise OutOfMemoryError(message + f"\n({agreed.note})")
                if failure is None:
                    raise OutOfMemoryError(message + "\n(Predicted from the compiled step's memory analysis; not run.)")
                raise self.rebuild(failure, message) from failure
            k = nxt
