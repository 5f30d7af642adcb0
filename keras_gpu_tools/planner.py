"""plan_batch_size: the largest batch that fits each device, found before training.

The backend answers "what is the peak memory of one training step at batch b,
per device?" (``Backend.step_memory``): on JAX from XLA's memory analysis of
the compiled train step (compiled, never run); on TensorFlow and torch from a
few real trial steps and the allocator's peak (torch on a CPU: the peak of
tensor storage alive at once, counted op by op, since its CPU allocator
keeps no statistics). :func:`~keras_gpu_tools.memory.search.search_batch_size`
searches with it, exponentially then by halving. This module validates the
arguments and wires the backend to the search (``memory/search.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from keras_gpu_tools import backends
from keras_gpu_tools.input.flops import table_peak
from keras_gpu_tools.memory.search import BatchPlan, StepPeaks, Trial, TrialClock, sample_batch, search_batch_size
from keras_gpu_tools.memory.throughput import Budget, Candidate, knee
from keras_gpu_tools.memory.throughput_run import ThroughputRun, is_dataset, one_batch
from keras_gpu_tools.memory.timed_fit import fit_side_effects, forget_compiled_trials, restore_side_effects
from keras_gpu_tools.runtime.batches import leading_dim, leaves
from keras_gpu_tools.runtime.validation import check_choice, check_int, check_log_dir, check_number

OBJECTIVES = ("memory", "throughput")
# By throughput, the memory search may take this share of max_seconds; the rest times the candidates.
MEMORY_SEARCH_SHARE = 0.5
DEFAULT_MAX_SECONDS = 120.0  # by throughput, planning's budget unless given (math.inf: none)
logger = logging.getLogger("keras_gpu_tools")


def plan_batch_size(
    model,
    x,
    y=None,
    *,
    objective: str = "memory",
    max_batch_size: int | None = None,
    memory_limit_mib: float | None = None,
    margin: float = 0.1,
    global_batch_size: int | None = None,
    max_seconds: float | None = None,
    log_dir: str | None = None,
) -> BatchPlan:
    """Finds the largest batch size that fits every device, with headroom.

    The model must be compiled. Only the shapes and dtypes of one sample of
    `x` (and `y`) matter on JAX: no batch of a trial's size is built on the
    host, so planning for a large card takes no more host memory than for a
    small one. TensorFlow and torch train on real batches built from them
    (repeated where `x` has fewer samples than the batch), and the weights,
    the optimizer state and the metrics are put back afterwards.

    How the peak memory of a step is obtained (the plan's `method`):

    - JAX: XLA's memory analysis of the compiled train step (its arguments,
      temporaries and outputs, less the outputs that reuse donated
      arguments), per device; compiled, never run, so no trial step and no
      out-of-memory error.
    - TensorFlow: trial steps and `tf.config.experimental.get_memory_info`'s
      peak per device. On a CPU, TensorFlow's allocator keeps statistics only
      with `TF_CPU_ALLOCATOR_USE_BFC=true` set before TensorFlow is imported.
      Under `tf.distribute.MirroredStrategy` the trial steps are `fit()`
      steps, each replica training its share, and the peaks are per replica
      (on GPUs: the CPU devices of a strategy share one allocator, so a CPU
      strategy plans by throughput only, bounded by `max_batch_size`).
    - torch: trial steps and `torch.cuda.max_memory_allocated` per device; on
      a CPU the peak of tensor storage alive at once during the step (counted
      op by op), plus the model's state.

    A trial that runs out of memory counts as not fitting.

    Args:
        model: a compiled Keras model.
        x: input data: an array, or a list/dict of arrays (a batch's structure);
            by throughput also a `keras.utils.PyDataset` or a `tf.data.Dataset`
            (one batch of it is planned from; an unbatched dataset's first
            samples are batched for the trials).
        y: target data with as many samples as `x`; None only for a model
            compiled without a loss.
        max_batch_size: the largest global batch size to consider, or None
            for no limit. Under data parallelism the plan is a multiple of
            the device count, so at least one sample per device: a smaller
            value is refused. Defaults to `None`.
        memory_limit_mib: the memory of each device to plan for, in MiB;
            defaults to each device's capacity. Set it to plan for a smaller
            card, or on a CPU (which reports none). Defaults to `None`.
        margin: the share of each device's memory left free. Defaults to `0.1`.
        objective: `"memory"`, the largest batch that fits; or
            `"throughput"`, the smallest batch within 5% of the fastest
            samples/s among those that fit, each candidate timed with short
            `fit()`s (compile time apart): on `x` and `y` themselves where
            they are arrays holding two batches of the largest candidate (the
            speed a fit on them reaches, Keras's batching of the arrays
            included: on torch it can cap the speed, and not alike at every
            batch), else on one batch of `x` repeated (the step's own
            speed). The candidates are sizes users pick: powers of
            two up to the largest that fits and that largest (a multiple of
            8), then multiples of 8 around the knee where a finer step pays
            (under `global_batch_size`, its divisors that are multiples of
            8). Each is timed until its samples/s is known within ±2% (one
            standard error over repeated windows) or its share of
            `max_seconds` is spent (the table says which); a candidate is
            within 5% when its samples/s over the fastest's, less that ratio's
            uncertainty (the two added in quadrature), reaches 95%; an input pipeline slower than it caps what
            training reaches at any batch (`InputBoundDetector` says). Under data parallelism
            (`keras.distribution`, `tf.distribute.MirroredStrategy`) the
            candidates are per device, and every process of a job plans the
            same batch from the slowest process's figures. Defaults to `"memory"`.
        global_batch_size: by throughput, a fixed global batch: the plan is
            its fastest micro-batch (for `OOMBatchSizeReducer(plan=...)`).
            Defaults to `None`.
        max_seconds: by throughput, the time planning may take; a candidate
            that would not finish in what is left (its expected compile
            counted twice: a compile cannot be cut short) is reported as not
            measured, and so are the batches above a doubling known to gain
            under 1% (the device is saturated). The memory search takes at
            most half of it: it stops before a trial expected to overrun that
            share, with the largest size known to fit, and the plan's `why`
            says so. `math.inf` plans without a budget, timing every
            candidate. Defaults to `None`: 120 seconds by throughput (it
            applies to objective="throughput" only).
        log_dir: a TensorBoard log directory: the plan is written to its run
            `plan` (text, JSON, scalars per batch size, a figure), and
            `keras_gpu_tools.report(log_dir)` shows it. Defaults to `None`.

    Returns:
        A `BatchPlan`: `batch_size` (global), `per_device_batch_size`,
        `devices`, `peak_mib` and `capacity_mib` per device, `margin`,
        `method` and `trials`. Pass it to `OOMBatchSizeReducer(plan=...)` so
        that training starts split at a larger batch and never regrows past it.

    Example:

    ```python
    import keras_gpu_tools

    plan = keras_gpu_tools.plan_batch_size(model, x_train, y_train)
    print(plan)  # batch size 3072: predicted peak 70.8 GiB of 79.1 GiB ...
    model.fit(x_train, y_train, batch_size=plan.batch_size)
    ```
    """
    args = _check_arguments(
        model, objective, max_batch_size, memory_limit_mib, margin, global_batch_size, max_seconds, log_dir
    )
    budget = Budget(args.max_seconds)
    arrays = not is_dataset(x)
    x, y = one_batch(x, y, model)
    n_samples = _num_samples(model, x, y)
    backend = backends.get()
    replicas = backend.replicas(model)
    s = _Setting(args, model, backend, (x, y, n_samples), replicas, backend.topology(model), budget, arrays)
    _check_devices(args, replicas)
    capacities = _capacities(s)
    limits = None if capacities is None else [(1.0 - args.margin) * c for c in capacities]
    problem = backend.plan_problem(model, replicas, memory_search=limits is not None)
    if problem is not None:  # before anything is built or trained
        raise ValueError(problem)
    # Trial steps train the model: everything is built first, copied (the metrics' state, a fit's
    # last results, too), and put back after.
    snapshot = backend.plan_snapshot(model, sample_batch(x, y, replicas, n_samples))
    side_effects = fit_side_effects(model)
    measure = _step_peaks(s)
    try:
        found = _memory_search(s, measure, limits)
        if args.throughput and found.best > 0:
            _by_throughput(s, found, measure if backend.plans_on_shapes and limits is not None else None)
    finally:
        backend.plan_restore(model, snapshot)
        restore_side_effects(model, side_effects)
        forget_compiled_trials(backend, bool(getattr(model, "jit_compile", False)))
    plan = _plan(s, found, capacities)
    if args.log_dir is not None and s.topology.is_chief:
        plan.write(args.log_dir)
    return plan


@dataclass(frozen=True)
class _Arguments:
    """plan_batch_size's arguments, checked."""

    objective: str
    max_batch_size: int | None
    memory_limit_mib: float | None
    margin: float
    global_batch_size: int | None
    max_seconds: float | None
    log_dir: str | None

    @property
    def throughput(self) -> bool:
        return self.objective == "throughput"


@dataclass
class _Setting:
    """What the steps of one plan share, once the arguments are checked."""

    args: _Arguments
    model: Any
    backend: Any
    data: tuple[Any, Any, int]  # x and y (one batch), and the samples of x
    replicas: int  # the data-parallel devices
    topology: Any
    budget: Budget
    arrays: bool  # x and y are the user's arrays (not one batch of a dataset)

    @property
    def per_device_max(self) -> int | None:
        """The largest per-device batch to consider: the bound over the devices, or None for none."""
        a = self.args
        bound = a.max_batch_size if a.global_batch_size is None else a.global_batch_size
        return None if bound is None else bound // self.replicas


@dataclass
class _Found:
    """What the memory search found, then what timing the candidates chose (by throughput)."""

    best: int  # per device
    trials: list[Trial]
    method: str
    clock: TrialClock | None = None  # the memory search's share of max_seconds, where it had one
    candidates: list[Candidate] = field(default_factory=list)
    why: str = ""


def _check_arguments(
    model, objective, max_batch_size, memory_limit_mib, margin, global_batch_size, max_seconds, log_dir
) -> _Arguments:
    """The arguments checked, alone and together, before any data is looked at."""
    args = _Arguments(
        objective=check_choice("objective", objective, OBJECTIVES),
        max_batch_size=check_int("max_batch_size", max_batch_size, low=1, allow_none=True),
        memory_limit_mib=check_number(
            "memory_limit_mib", memory_limit_mib, low=0, exclusive_low=True, allow_none=True, what="number of MiB"
        ),
        margin=check_number("margin", margin, low=0, high=1, exclusive_high=True, what="fraction"),
        global_batch_size=check_int("global_batch_size", global_batch_size, low=1, allow_none=True),
        max_seconds=check_number(
            "max_seconds",
            max_seconds,
            low=0,
            exclusive_low=True,
            allow_none=True,
            finite=False,
            what="number of seconds",
        ),
        log_dir=check_log_dir("log_dir", log_dir),
    )
    for name, value in (("global_batch_size", args.global_batch_size), ("max_seconds", args.max_seconds)):
        if value is not None and not args.throughput:
            raise ValueError(
                f"Invalid value for argument `{name}`. Received: {name}={value!r} with objective='memory'. "
                "Expected None: it applies to objective='throughput' only."
            )
    if args.throughput:  # a budget by default; math.inf plans without one
        seconds = DEFAULT_MAX_SECONDS if args.max_seconds is None else args.max_seconds
        args = dataclasses.replace(args, max_seconds=None if math.isinf(seconds) else seconds)
    if args.global_batch_size is not None and args.max_batch_size is not None:
        raise ValueError(
            f"Invalid value for argument `max_batch_size`. Received: max_batch_size={args.max_batch_size} with "
            f"global_batch_size={args.global_batch_size}. Expected None: a fixed global batch bounds the micro-batch "
            "itself."
        )
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            "plan_batch_size needs a compiled model (`model.compile(optimizer, loss)`): it plans a training step."
        )
    return args


def _check_devices(args: _Arguments, replicas: int) -> None:
    """The batch bounds against the data-parallel devices: at least one sample per device, a multiple of them."""
    if args.max_batch_size is not None and args.max_batch_size < replicas:
        raise ValueError(
            f"Invalid value for argument `max_batch_size`. Received: max_batch_size={args.max_batch_size}, but the "
            f"batch is split over {replicas} devices (data parallelism). Expected at least {replicas}: one sample per "
            "device."
        )
    if args.global_batch_size is not None and args.global_batch_size % replicas:
        raise ValueError(
            f"Invalid value for argument `global_batch_size`. Received: global_batch_size={args.global_batch_size}, "
            f"but the batch is split over {replicas} devices (data parallelism). Expected a multiple of {replicas}."
        )


def _capacities(s: _Setting) -> list[float] | None:
    """The bytes of each device to plan for; None where none is known and the candidates are bounded."""
    args = s.args
    reported = s.backend.device_capacities(s.model, s.replicas)
    if args.memory_limit_mib is not None:
        return [args.memory_limit_mib * 2**20] * s.replicas
    if any(c is None for c in reported):
        if not (args.throughput and s.per_device_max is not None):
            raise ValueError(
                "Invalid value for argument `memory_limit_mib`. Received: memory_limit_mib=None, but this device "
                "reports no memory capacity (a CPU). Expected the memory to plan for, in MiB (e.g. "
                "memory_limit_mib=16384)"
                + (", or max_batch_size= / global_batch_size= to bound the candidates." if args.throughput else ".")
            )
        return None  # nothing to plan against: every batch up to the bound is a candidate
    return [c for c in reported if c is not None]


def _step_peaks(s: _Setting) -> StepPeaks:
    """The peak memory of one training step per device, at a per-device batch size."""
    x, y, n_samples = s.data
    backend = s.backend

    def step_memory(per_device: int) -> tuple[list[float], str]:
        # A step compiled, never run (JAX), needs the trial batch's shapes only: no host batch of its size.
        batch = sample_batch(x, y, per_device * s.replicas, n_samples, shapes_only=backend.plans_on_shapes)
        return backend.step_memory(s.model, batch, s.replicas)

    return StepPeaks(
        step_memory,
        backends.is_oom,
        backend.device_memory,
        s.replicas,
    )


def _memory_search(s: _Setting, measure: StepPeaks, limits: list[float] | None) -> _Found:
    """The largest per-device batch under ``limits``; without limits, the bound (every batch up to it a candidate)."""
    if limits is None:
        method = "no memory capacity to plan against (a CPU): every batch up to the bound is a candidate"
        return _Found(s.per_device_max or 0, [], method)
    clock = None
    if s.args.throughput and s.args.max_seconds is not None:
        share = MEMORY_SEARCH_SHARE * s.args.max_seconds - s.budget.elapsed()
        clock = TrialClock(measure, share, s.budget.clock)
    best, trials = search_batch_size(
        clock or measure,
        limits,
        start=1,
        maximum=s.per_device_max,
        refuses=None if clock is None else clock.refuses,
    )
    return _Found(best, trials, measure.method or s.backend.plan_method(s.model), clock)


def _by_throughput(s: _Setting, found: _Found, peak_of: StepPeaks | None) -> None:
    """Times the candidates up to ``found.best`` and chooses the knee; ``peak_of``: their peaks, compiled only."""
    model, backend, args = s.model, s.backend, s.args
    dtype = model.dtype_policy.compute_dtype
    peak_flops = table_peak(backend, dtype, lambda key, message: logger.info("keras_gpu_tools: %s", message))
    run = ThroughputRun(model, backend, s.data, s.replicas, peak_of, s.budget, s.topology, peak_flops, arrays=s.arrays)
    divides = None if args.global_batch_size is None else args.global_batch_size // s.replicas
    found.candidates = candidates = run.measure(found.best, found.trials, divides)
    chosen, found.why = knee(candidates)
    if found.clock is not None and found.clock.stopped:
        found.why += f"; {found.clock.stopped}"
    if chosen is None:
        raise ValueError(
            f"Invalid value for argument `max_seconds`. Received: max_seconds={args.max_seconds:g}, too small to "
            f"measure one candidate: building the step and the memory search took {s.budget.elapsed():.2f} s. "
            "Expected more time (or math.inf for no limit; None is 120 s)."
            if args.max_seconds is not None and all("budget" in c.reason for c in candidates)
            else f"plan_batch_size: no candidate batch could be measured: {candidates[0].reason}"
        )
    found.best = chosen.per_device_batch_size
    found.method += (
        "; then each candidate timed with model.fit on your arrays (whole batches of them, compile apart, then the "
        "steady state): the speed your fit reaches with them, Keras's batching of the arrays included"
        if run.on_arrays
        else "; then each candidate timed with model.fit on one batch repeated (compile apart, then the steady "
        "state): the step's speed without your input pipeline's, which InputBoundDetector measures"
    )


def _plan(s: _Setting, found: _Found, capacities: list[float] | None) -> BatchPlan:
    """The plan of what was found."""
    best, args = found.best, s.args
    peak = next((t.peak_bytes for t in reversed(found.trials) if t.fits and t.batch_size == best), None)
    why = found.why
    if args.global_batch_size is not None and best > 0:
        k = args.global_batch_size // (best * s.replicas)
        why += (
            f"; the global batch of {args.global_batch_size} runs as {k} micro-batches of {best * s.replicas}"
            if k > 1
            else f"; the global batch of {args.global_batch_size} runs whole"
        )
    return BatchPlan(
        batch_size=best * s.replicas,
        per_device_batch_size=best,
        devices=s.replicas,
        peak_mib=[p / 2**20 for p in (peak or [])],
        capacity_mib=[c / 2**20 for c in (capacities or [])],
        margin=args.margin,
        method=found.method,
        trials=found.trials,
        objective=args.objective,
        candidates=found.candidates,
        why=why,
        global_batch_size=args.global_batch_size,
        plan_seconds=s.budget.elapsed(),
    )


def _num_samples(model, x, y) -> int:
    """The samples of ``x``, once ``x`` and ``y`` are known to make a training step (checked before anything is built)."""
    n = leading_dim(x)
    if not n:
        raise ValueError(
            f"Invalid value for argument `x`. Received: x of type {type(x).__name__}. Expected an array, or a "
            "list/dict of arrays, with at least one sample."
        )
    if y is None:
        if getattr(model, "loss", None) is not None:
            raise ValueError(
                f"Invalid value for argument `y`. Received: y=None, but the model was compiled with a loss "
                f"(loss={model.loss!r}). Expected the targets of `x`, as `model.fit(x, y)` takes them: the planned "
                "training step computes the loss."
            )
        return n
    x_sizes, y_sizes = _sizes(x), _sizes(y)
    if len(set(x_sizes + y_sizes)) > 1:
        raise ValueError(
            "Data cardinality is ambiguous: `x` and `y` must hold the same number of samples. Received: "
            f"x sizes: {', '.join(map(str, x_sizes))}; y sizes: {', '.join(map(str, y_sizes))}."
        )
    return n


def _sizes(data) -> list[int]:
    """The first dimension of every array in ``data`` (arrays without one are left out)."""
    out = []
    for a in leaves(data):
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] is not None:
            out.append(int(shape[0]))
    return out


__all__ = ["BatchPlan", "plan_batch_size"]
