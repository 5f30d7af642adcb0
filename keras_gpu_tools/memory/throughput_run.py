"""Measuring the candidates of a throughput plan, one process or a job's processes in step.

:class:`ThroughputRun` takes the largest batch that fits (the memory search's
answer), measures each candidate of :func:`~keras_gpu_tools.memory.throughput.candidate_sizes`
with :func:`~keras_gpu_tools.memory.timed_fit.time_batch`, smallest first, and
returns the rows. In a job of several processes whose step spans them
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
from keras_gpu_tools.memory.throughput import Budget, Candidate, candidate_sizes, expected_seconds, slowest
from keras_gpu_tools.memory.timed_fit import Pace, time_batch

logger = logging.getLogger("keras_gpu_tools")

SMALLEST_SHARE = 64  # candidates start at the largest batch that fits over this (a power of two), at least 1
EXCHANGE_TIMEOUT_S = 900.0  # a process waits this long for the others' figures (their compiles included)
_serial = itertools.count(1)  # throughput plans in this process: every process of a job counts alike


def one_batch(x, y):
    """``(x, y)`` as arrays: as given, or one batch of a `PyDataset` or `tf.data.Dataset` (its structure and shapes).

    A generator or any other one-pass iterator is refused: taking a batch from
    it would take that batch from training.
    """
    kind = type(x).__name__
    dataset = hasattr(x, "element_spec") or (hasattr(x, "__getitem__") and hasattr(x, "num_batches"))
    if not dataset:
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
    ):
        self.model, self.backend = model, backend
        self.x, self.y, self.n = data
        self.replicas = replicas
        self.peak_of = peak_of  # a candidate's peak bytes per device (None: unknown), where not in the trials
        self.budget = budget
        spans = topology is not None and topology.multi_process and topology.exchange is not None
        self.exchange = topology.exchange if spans else None
        self.processes = topology.process_count if spans else 1
        self.peak_flops = peak_flops
        self.pace = pace or Pace.for_device(bool(backend.gpu_devices()))
        self.key = f"plan{next(_serial)}"

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

    def measure(self, largest: int, trials: list[Trial], divides: int | None = None) -> list[Candidate]:
        """The rows of every candidate up to ``largest`` per device (dividing ``divides`` where given)."""
        sizes = candidate_sizes(largest, smallest=max(1, largest // SMALLEST_SHARE), divides=divides)
        rows: list[Candidate] = []
        measured: list[tuple[float, float]] = []  # (compile, wall) seconds of each measured candidate
        stop_reason = ""
        for per_device in sizes:
            b = per_device * self.replicas
            peak_mib, fits = self._peak(per_device, trials)
            reason = stop_reason or (self.budget.refuses(expected_seconds(measured)) or "")
            reasons = [r for r in self._agree(f"go{per_device}", reason) if r]
            if reasons:
                rows.append(Candidate(b, per_device, fits, peak_mib=peak_mib, reason=reasons[0]))
                continue
            # Each process feeds its share of the global batch (keras.distribution over several processes).
            batch = sample_batch(self.x, self.y, b // self.processes, self.n)
            try:
                if self.exchange is None:
                    timing = time_batch(self.model, batch, self.pace, out_of_time=lambda: self.budget.left() <= 0)
                else:  # collective steps: the same steps in every process (its budget is asked before the fits)
                    steps = functools.partial(self._job_steps, per_device)
                    timing = time_batch(self.model, batch, self.pace, job_steps=steps)
            except Exception as e:
                if not self.backend.is_oom(e):
                    raise
                stop_reason = f"not measured: batch {b} ran out of memory when trained"
                rows.append(Candidate(b, per_device, False, peak_mib=peak_mib, reason="ran out of memory when trained"))
                continue
            measured.append((timing.compile_seconds, timing.wall_seconds))
            flops = self._flops(per_device)
            mfu = None
            if flops and self.peak_flops:
                mfu = flops / timing.step_seconds / (self.peak_flops * self.replicas)
            rows.append(
                Candidate(
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
                )
            )
        if self.exchange is None:
            return rows
        return slowest(self._agree("rows", [r.as_dict() for r in rows]))


__all__ = ["ThroughputRun", "one_batch"]
