"""Measuring the candidates of a throughput plan, one process or a job's processes in step.

:class:`ThroughputRun` takes the largest batch that fits (the memory search's
answer), measures each candidate of :func:`~keras_gpu_tools.memory.throughput.candidate_sizes`
with :func:`~keras_gpu_tools.memory.timed_fit.time_batch`, smallest first,
each until its figure is known or its share of ``max_seconds`` is spent (what
is left over the candidates still to measure), then the finer sizes around
the knee that :func:`~keras_gpu_tools.memory.throughput.finer_size` asks for,
and returns the rows. In a job of several processes whose step spans them
(``keras.distribution`` over every process's devices), the fits are
collective: every process decides together, before each candidate, whether it
is measured (the budget of any process refuses it for all), every process
runs the same steps per epoch (a process that ran one step more would wait
for the others forever), and the rows are merged at the end (each candidate's slowest process), so that every process
picks the same knee. :func:`one_batch` turns a dataset into one batch's arrays.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.memory.search import Trial, sample_batch
from keras_gpu_tools.memory.throughput import (
    Budget,
    Candidate,
    candidate_sizes,
    could_refine,
    expected_compile,
    expected_seconds,
    finer_size,
    saturation,
    slowest,
)
from keras_gpu_tools.memory.timed_fit import FitInput, Pace, current_pace, time_batch, time_fit
from keras_gpu_tools.runtime.batches import map_leaves

logger = logging.getLogger("keras_gpu_tools")

SMALLEST_SHARE = 64  # candidates start at the largest batch that fits over this (a power of two), at least 1
# The fewest steps a timing runs: the first call, two rough steps, a warm-up window and two windows.
FEWEST_STEPS = 6
MAX_FINER = 3  # finer steps around the knee, at most (each halves the interval it lies in)
UNBATCHED_TAKE = 64  # samples of an unbatched dataset the trials are built from (repeated to each size)
# Candidates are timed on the user's own arrays where these hold this many batches of the largest one.
ARRAY_BATCHES = 2
EXCHANGE_TIMEOUT_S = 900.0  # a process waits this long for the others' figures (their compiles included)
_serial = itertools.count(1)  # throughput plans in this process: every process of a job counts alike


def is_dataset(x) -> bool:
    """Whether ``x`` is a `tf.data.Dataset` or a `keras.utils.PyDataset` (else arrays, or a structure of them)."""
    return hasattr(x, "element_spec") or (hasattr(x, "__getitem__") and hasattr(x, "num_batches"))


def one_batch(x, y, model=None):
    """``(x, y)`` as arrays: as given, or one batch of a `PyDataset` or `tf.data.Dataset` (its structure and shapes).

    A generator or any other one-pass iterator is refused: taking a batch from
    it would take that batch from training. A `tf.data.Dataset` of single
    samples (not batched; see :func:`_unbatched`, ``model``'s inputs help
    tell) is batched for the trials: its first :data:`UNBATCHED_TAKE` samples.
    """
    kind = type(x).__name__
    if not is_dataset(x):
        if hasattr(x, "__next__") and not hasattr(x, "shape"):
            raise ValueError(
                f"Invalid value for argument `x`. Received: x of type {kind} (a generator or iterator). Expected "
                "arrays, a keras.utils.PyDataset or a tf.data.Dataset: a batch taken from a generator is gone from "
                "training. Pass one batch's arrays (x, y) instead; only their structure and shapes are planned from."
            )
        return x, y
    if y is not None:
        raise ValueError(
            f"Invalid value for argument `y`. Received: y of type {type(y).__name__} with x of type {kind}. "
            "Expected None: the dataset yields the targets."
        )
    if hasattr(x, "element_spec"):  # tf.data: re-iterable, one batch taken from a fresh pass
        if _unbatched(x.element_spec, _model_inputs(model)):
            x = _batched(x)
        batch = next(iter(x.take(1).as_numpy_iterator()), None)
    else:
        batch = x[0] if x.num_batches != 0 else None
    if batch is None:
        raise ValueError(f"Invalid value for argument `x`. Received: an empty {kind}. Expected at least one batch.")
    if not isinstance(batch, tuple):
        return batch, None
    if len(batch) == 3 and batch[2] is not None:
        logger.info("keras_gpu_tools: plan_batch_size plans without the dataset's sample weights")
    return batch[0], batch[1] if len(batch) > 1 else None


def _specs(tree) -> list[Any]:
    """The leaves of a dataset's ``element_spec`` (nested tuples, lists and dicts of `TensorSpec`)."""
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _specs(v)]
    if isinstance(tree, (list, tuple)):
        return [leaf for v in tree for leaf in _specs(v)]
    return [] if tree is None else [tree]


def _rank_and_lead(spec) -> tuple[int | None, int | None]:
    shape: Any = getattr(spec, "shape", None)
    rank = getattr(shape, "rank", None)
    if rank is None:
        return None, None
    lead = shape[0] if rank > 0 else None
    return rank, None if lead is None else int(lead)


def _unbatched(element_spec, model_inputs) -> bool:
    """Whether a `tf.data.Dataset` yields single samples rather than batches.

    A batch's arrays all have a first dimension, unknown (``batch()``) or the
    same size (``drop_remainder=True``). A dataset whose elements have a
    scalar or first dimensions that differ is of samples, and so is one whose
    inputs have one dimension fewer than the model's inputs (where it has them).
    """
    specs = [_rank_and_lead(s) for s in _specs(element_spec)]
    if not specs or any(rank is None for rank, _ in specs):
        return False  # shapes unknown: taken as batches, as Keras's fit takes them
    if all(rank and rank > 0 and lead is None for rank, lead in specs):
        return False  # batch(): the first dimension is the unknown batch size
    if any(rank == 0 for rank, _ in specs) or len({lead for _, lead in specs}) > 1:
        return True
    inputs = _specs(element_spec[0] if isinstance(element_spec, tuple) else element_spec)
    wanted = [len(getattr(t, "shape", ())) for t in (model_inputs or [])]
    if wanted and len(inputs) == len(wanted):
        return all(_rank_and_lead(s)[0] == w - 1 for s, w in zip(inputs, wanted))
    return False


def _model_inputs(model) -> list[Any] | None:
    """A functional model's inputs (their ranks tell a sample from a batch), None where it has none."""
    try:
        inputs = getattr(model, "inputs", None)
    except Exception:  # a subclassed model that was never called
        return None
    return list(inputs) if isinstance(inputs, (list, tuple)) else None


def _batched(dataset):
    """One batch of an unbatched dataset's first samples, for the trials; refused where its samples do not stack."""
    try:
        batched = dataset.batch(UNBATCHED_TAKE)
        next(iter(batched.take(1)), None)
    except Exception as e:  # ragged or differently shaped samples: no batch to plan from
        raise ValueError(
            f"Invalid value for argument `x`. Received: x of type {type(dataset).__name__} that yields single "
            f"samples (not batches), which do not stack into a batch ({type(e).__name__}: {str(e)[:200]}). Expected "
            "a batched tf.data.Dataset, as model.fit takes it: `dataset.batch(batch_size)` (with padding where the "
            "samples' shapes differ)."
        ) from None
    logger.info(
        "keras_gpu_tools: plan_batch_size: x yields single samples (an unbatched tf.data.Dataset); "
        "planned from a batch of its first %d samples: batch it with the plan's batch size for fit()",
        UNBATCHED_TAKE,
    )
    return batched


class ThroughputRun:
    """The candidates of one throughput plan, measured (see the module docstring)."""

    def __init__(
        self,
        model,
        backend: Any,
        data: tuple[Any, Any, int],
        replicas: int,
        peak_of: Callable[[int], list[float] | None] | None,
        budget: Budget,
        topology: Any,
        peak_flops: float | None = None,
        pace: Pace | None = None,
        arrays: bool = False,
    ):
        self.model, self.backend = model, backend
        self.x, self.y, self.n = data
        self.arrays = arrays  # x and y are the user's own arrays, not one batch of a dataset
        self.on_arrays = False  # the candidates are timed on them (measure decides)
        self.replicas = replicas
        self.peak_of = peak_of  # a candidate's peak bytes per device (None: unknown), where not in the trials
        self.budget = budget
        spans = topology is not None and topology.multi_process and topology.exchange is not None
        self.exchange = topology.exchange if spans else None
        self.processes = topology.process_count if spans else 1
        self.peak_flops = peak_flops
        self.pace = pace or current_pace(bool(backend.gpu_devices()))
        self.key = f"plan{next(_serial)}"
        self._seconds: dict[int, tuple[float, float]] = {}  # per device size: (compile, expected wall) seconds
        self._steps: dict[int, float] = {}  # per device size: the measured step seconds
        self._oom_at: int | None = None  # the batch that ran out of memory when trained: none as large is tried

    def _agree(self, name: str, value: Any) -> list[Any]:
        """Every process's ``value`` (this process's alone outside a job)."""
        if self.exchange is None:
            return [value]
        return self.exchange.gather(f"{self.key}/{name}", value, EXCHANGE_TIMEOUT_S)

    def _job_steps(self, per_device: int, steps: int) -> int:
        """The steps per epoch every process runs: the most any process asks for."""
        return max(int(s) for s in self._agree(f"steps{per_device}", steps))

    def _flops(self, per_device: int) -> float | None:
        if self.peak_flops is None:
            return None
        batch = sample_batch(self.x, self.y, per_device * self.replicas, self.n, shapes_only=True)
        try:
            return self.backend.plan_step_flops(self.model, batch, self.replicas)
        except Exception as e:  # MFU is left out; the plan goes on
            logger.info("keras_gpu_tools: plan_batch_size: no FLOPs for MFU (%s: %s)", type(e).__name__, e)
            return None

    def _peak(self, per_device: int, trials: list[Trial]) -> tuple[float | None, bool]:
        """The candidate's peak in MiB (most over the devices) and whether it fits."""
        found = next((t for t in trials if t.batch_size == per_device and t.peak_bytes), None)
        peaks = found.peak_bytes if found is not None else (self.peak_of(per_device) if self.peak_of else None)
        fits = found.fits if found is not None else True
        return (max(peaks) / 2**20 if peaks else None), fits

    def _merged(self, rows: list[Candidate], name: str) -> list[Candidate]:
        """The rows every process agrees on: its own outside a job, else each candidate's slowest process."""
        if self.exchange is None:
            return rows
        return slowest(self._agree(name, [r.as_dict() for r in rows]))

    def _share(self, still: int) -> float | None:
        """This candidate's seconds: what is left of ``max_seconds`` over the ``still`` candidates to measure."""
        if self.budget.max_seconds is None:
            return None
        return max(0.0, self.budget.left()) / max(1, still)

    def measure(self, largest: int, trials: list[Trial], divides: int | None = None) -> list[Candidate]:
        """The rows of every candidate up to ``largest`` per device (dividing ``divides`` where given).

        First :func:`candidate_sizes`, smallest first; then, while
        :func:`finer_size` finds a finer step that pays, sizes between the
        knee and the measured size below it. The rows come sorted by size.
        """
        sizes = candidate_sizes(largest, smallest=max(1, largest // SMALLEST_SHARE), divides=divides)
        refine = could_refine(sizes, divides)
        # Every candidate the same way: on the user's arrays (as their fit reads them, the host's batching
        # included) where they hold enough batches of the largest and no job must run agreed steps, else
        # on one batch repeated (the step alone).
        self.on_arrays = bool(
            self.arrays and sizes and self.exchange is None and self.n >= ARRAY_BATCHES * sizes[-1] * self.replicas
        )
        rows: list[Candidate] = []
        self._seconds, self._steps, self._oom_at = {}, {}, None
        for i, per_device in enumerate(sizes):
            still = len(sizes) - i + (1 if refine else 0)  # a finer step is kept a share
            # Under a budget, a saturated device ends the climb: larger batches' compiles grow, not their speed.
            saturated = saturation(rows) if self.budget.max_seconds is not None else ""
            rows.append(self._candidate(per_device, trials, *self._expected(per_device), still, saturated))
        if not refine:
            return sorted(self._merged(rows, "rows"), key=lambda r: r.batch_size)
        for step in range(MAX_FINER):
            merged = self._merged(rows, f"rows{step}")
            refused = any(not r.measured for r in merged[len(sizes) :])  # the budget is spent: no finer step
            finer = None if refused else finer_size(merged, divides=divides)
            if finer is None:
                return sorted(merged, key=lambda r: r.batch_size)
            # Between two measured sizes: expected to take about as long as the larger one did.
            above = [s for b, s in sorted(self._seconds.items()) if b > finer]
            measured = list(self._seconds.values())
            compiling, wall = above[0] if above else (expected_compile(measured), expected_seconds(measured))
            rows.append(self._candidate(finer, trials, wall, compiling, MAX_FINER - step))
        return sorted(self._merged(rows, "rows"), key=lambda r: r.batch_size)

    def _arrays(self, b: int) -> FitInput:
        """The user's arrays as a fit at batch ``b`` reads them: whole batches only (a last, smaller one would
        compile anew), an even number of them (a window of steps divides a pass: 2 always does)."""
        m = (self.n // (2 * b)) * 2 * b
        x, y = (map_leaves(lambda a: a[:m], t) for t in (self.x, self.y))  # views: no copy
        per_call = int(getattr(self.model, "steps_per_execution", 1) or 1)
        data = {"x": x, "batch_size": b} if y is None else {"x": x, "y": y, "batch_size": b}
        return FitInput(lambda: dict(data), m // b, per_call)

    def _expected(self, per_device: int) -> tuple[float, float]:
        """The seconds a candidate is expected to take, and to compile: compiles grow, and a step grows with its batch.

        A step of seconds (a large batch) makes the fewest steps of a timing
        outlast what the compile growth alone predicts.
        """
        measured = list(self._seconds.values())
        by_compile, compiling = expected_seconds(measured), expected_compile(measured)
        if not self._steps:
            return by_compile, compiling
        last, step = max(self._steps.items())
        return max(by_compile, compiling + FEWEST_STEPS * step * per_device / last), compiling

    def _candidate(
        self, per_device: int, trials: list[Trial], expected: float, compiling: float, still: int, saturated: str = ""
    ) -> Candidate:
        """One candidate measured (or the reason it is not): every process decides together whether it is."""
        b = per_device * self.replicas
        peak_mib, fits = self._peak(per_device, trials)
        oom = self._oom_at is not None and b >= self._oom_at  # a finer step below it is still tried
        reason = f"not measured: batch {self._oom_at} ran out of memory when trained" if oom else ""
        reason = reason or (f"not measured: {saturated}" if saturated else "")
        reason = reason or self.budget.refuses(expected, compiling) or ""
        reasons = [r for r in self._agree(f"go{per_device}", reason) if r]
        if reasons:
            return Candidate(b, per_device, fits, peak_mib=peak_mib, reason=reasons[0])
        try:
            if self.on_arrays:
                timing = time_fit(
                    self.model,
                    self._arrays(b),
                    self.pace,
                    out_of_time=self.budget.overrun,
                    share=self._share(still),
                )
            elif self.exchange is None:
                batch = sample_batch(self.x, self.y, b, self.n)
                timing = time_batch(
                    self.model,
                    batch,
                    self.pace,
                    out_of_time=self.budget.overrun,
                    share=self._share(still),
                    backend=self.backend,
                )
            else:  # collective steps: the same steps in every process (its budget is asked before the fits)
                # Each process feeds its share of the global batch (keras.distribution over several processes).
                batch = sample_batch(self.x, self.y, b // self.processes, self.n)
                steps = functools.partial(self._job_steps, per_device)
                timing = time_batch(self.model, batch, self.pace, job_steps=steps, backend=self.backend)
        except Exception as e:
            if not self.backend.is_oom(e):
                raise
            self._oom_at = b
            return Candidate(b, per_device, False, peak_mib=peak_mib, reason="ran out of memory when trained")
        # The next candidate's steady part is expected to take what this one's least would, not all it took:
        # its timing stops at its share of the budget.
        least = max((self.pace.min_windows + 1) * self.pace.epoch_seconds, FEWEST_STEPS * timing.step_seconds)
        steady = min(max(0.0, timing.wall_seconds - timing.compile_seconds), least)
        self._seconds[per_device] = (timing.compile_seconds, timing.compile_seconds + steady)
        self._steps[per_device] = timing.step_seconds
        flops = self._flops(per_device)
        mfu = None
        if flops and self.peak_flops:
            mfu = flops / timing.step_seconds / (self.peak_flops * self.replicas)
        return Candidate(
            b,
            per_device,
            fits,
            measured=True,
            samples_per_sec=b / timing.step_seconds,
            compile_seconds=timing.compile_seconds,
            step_seconds=timing.step_seconds,
            peak_mib=peak_mib,
            mfu=mfu,
            steps=timing.steps,
            uncertainty=timing.uncertainty,
            windows=timing.windows,
            stopped=timing.stopped,
        )


__all__ = ["ThroughputRun", "is_dataset", "one_batch"]
