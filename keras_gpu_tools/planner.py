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

import logging

from keras_gpu_tools import backends
from keras_gpu_tools.input.flops import table_peak
from keras_gpu_tools.memory.search import BatchPlan, StepPeaks, TrialClock, sample_batch, search_batch_size
from keras_gpu_tools.memory.throughput import Budget, Candidate, knee
from keras_gpu_tools.memory.throughput_run import ThroughputRun, one_batch
from keras_gpu_tools.memory.timed_fit import fit_side_effects, restore_side_effects
from keras_gpu_tools.runtime.batches import leading_dim, leaves
from keras_gpu_tools.runtime.validation import check_choice, check_int, check_log_dir, check_number

OBJECTIVES = ("memory", "throughput")
# By throughput, the memory search may take this share of max_seconds; the rest times the candidates.
MEMORY_SEARCH_SHARE = 0.5
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
            `fit()`s (compile time apart) on one batch of `x` repeated: the
            step's own speed. The candidates are sizes users pick: powers of
            two up to the largest that fits and that largest (a multiple of
            8), then multiples of 8 around the knee where a finer step pays
            (under `global_batch_size`, its divisors that are multiples of
            8). Each is timed until its samples/s is known within ±2% (one
            standard error over repeated windows) or its share of
            `max_seconds` is spent (the table says which); a candidate is
            within 5% when its samples/s plus its uncertainty reaches 95% of
            the fastest's less the fastest's uncertainty; an input pipeline slower than it caps what
            training reaches at any batch (`InputBoundDetector` says). Under data parallelism
            (`keras.distribution`, `tf.distribute.MirroredStrategy`) the
            candidates are per device, and every process of a job plans the
            same batch from the slowest process's figures. Defaults to `"memory"`.
        global_batch_size: by throughput, a fixed global batch: the plan is
            its fastest micro-batch (for `OOMBatchSizeReducer(plan=...)`).
            Defaults to `None`.
        max_seconds: by throughput, the time planning may take; a candidate
            that would not finish in what is left is reported as not
            measured. The memory search takes at most half of it: it stops
            before a trial expected to overrun that share, with the largest
            size known to fit, and the plan's `why` says so. Defaults to
            `None` (no limit).
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
    objective = check_choice("objective", objective, OBJECTIVES)
    max_batch_size = check_int("max_batch_size", max_batch_size, low=1, allow_none=True)
    memory_limit_mib = check_number(
        "memory_limit_mib", memory_limit_mib, low=0, exclusive_low=True, allow_none=True, what="number of MiB"
    )
    margin = check_number("margin", margin, low=0, high=1, exclusive_high=True, what="fraction")
    global_batch_size = check_int("global_batch_size", global_batch_size, low=1, allow_none=True)
    max_seconds = check_number(
        "max_seconds", max_seconds, low=0, exclusive_low=True, allow_none=True, what="number of seconds"
    )
    log_dir = check_log_dir("log_dir", log_dir)
    throughput = objective == "throughput"
    for name, value in (("global_batch_size", global_batch_size), ("max_seconds", max_seconds)):
        if value is not None and not throughput:
            raise ValueError(
                f"Invalid value for argument `{name}`. Received: {name}={value!r} with objective='memory'. "
                "Expected None: it applies to objective='throughput' only."
            )
    if global_batch_size is not None and max_batch_size is not None:
        raise ValueError(
            f"Invalid value for argument `max_batch_size`. Received: max_batch_size={max_batch_size} with "
            f"global_batch_size={global_batch_size}. Expected None: a fixed global batch bounds the micro-batch itself."
        )
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            "plan_batch_size needs a compiled model (`model.compile(optimizer, loss)`): it plans a training step."
        )
    budget = Budget(max_seconds)
    x, y = one_batch(x, y, model)
    n_samples = _num_samples(model, x, y)
    backend = backends.get()
    replicas = backend.replicas(model)
    topology = backend.topology(model)
    if max_batch_size is not None and max_batch_size < replicas:
        raise ValueError(
            f"Invalid value for argument `max_batch_size`. Received: max_batch_size={max_batch_size}, but the batch "
            f"is split over {replicas} devices (data parallelism). Expected at least {replicas}: one sample per device."
        )
    if global_batch_size is not None and global_batch_size % replicas:
        raise ValueError(
            f"Invalid value for argument `global_batch_size`. Received: global_batch_size={global_batch_size}, but "
            f"the batch is split over {replicas} devices (data parallelism). Expected a multiple of {replicas}."
        )
    bound = max_batch_size if global_batch_size is None else global_batch_size
    per_device_max = None if bound is None else bound // replicas
    reported = backend.device_capacities(model, replicas)
    capacities: list[float] | None
    if memory_limit_mib is not None:
        capacities = [memory_limit_mib * 2**20] * replicas
    elif any(c is None for c in reported):
        if not (throughput and per_device_max is not None):
            raise ValueError(
                "Invalid value for argument `memory_limit_mib`. Received: memory_limit_mib=None, but this device "
                "reports no memory capacity (a CPU). Expected the memory to plan for, in MiB (e.g. "
                "memory_limit_mib=16384)"
                + (", or max_batch_size= / global_batch_size= to bound the candidates." if throughput else ".")
            )
        capacities = None  # nothing to plan against: every batch up to the bound is a candidate
    else:
        capacities = [c for c in reported if c is not None]
    limits = None if capacities is None else [(1.0 - margin) * c for c in capacities]
    problem = backend.plan_problem(model, replicas, memory_search=limits is not None)
    if problem is not None:  # before anything is built or trained
        raise ValueError(problem)
    # Trial steps train the model: everything is built first, copied (the metrics' state, a fit's
    # last results, too), and put back after.
    snapshot = backend.plan_snapshot(model, sample_batch(x, y, replicas, n_samples))
    side_effects = fit_side_effects(model)

    def step_memory(per_device: int) -> tuple[list[float], str]:
        # A step compiled, never run (JAX), needs the trial batch's shapes only: no host batch of its size.
        batch = sample_batch(x, y, per_device * replicas, n_samples, shapes_only=backend.plans_on_shapes)
        return backend.step_memory(model, batch, replicas)

    measure = StepPeaks(
        step_memory,
        backends.is_oom,
        backend.device_memory,
        replicas,
    )
    candidates: list[Candidate] = []
    why = ""
    clock: TrialClock | None = None
    try:
        if limits is not None:
            if throughput and max_seconds is not None:
                clock = TrialClock(measure, MEMORY_SEARCH_SHARE * max_seconds - budget.elapsed(), budget.clock)
            best, trials = search_batch_size(
                clock or measure,
                limits,
                start=1,
                maximum=per_device_max,
                refuses=None if clock is None else clock.refuses,
            )
            method = measure.method or backend.plan_method(model)
        else:
            best, trials = per_device_max or 0, []
            method = "no memory capacity to plan against (a CPU): every batch up to the bound is a candidate"
        if throughput and best > 0:
            peak_of = measure if backend.plans_on_shapes and limits is not None else None  # compiled, never run
            dtype = model.dtype_policy.compute_dtype
            peak_flops = table_peak(backend, dtype, lambda key, message: logger.info("keras_gpu_tools: %s", message))
            run = ThroughputRun(model, backend, (x, y, n_samples), replicas, peak_of, budget, topology, peak_flops)
            divides = None if global_batch_size is None else global_batch_size // replicas
            candidates = run.measure(best, trials, divides)
            chosen, why = knee(candidates)
            if clock is not None and clock.stopped:
                why += f"; {clock.stopped}"
            if chosen is None:
                raise ValueError(
                    f"Invalid value for argument `max_seconds`. Received: max_seconds={max_seconds:g}, too small to "
                    f"measure one candidate: building the step and the memory search took {budget.elapsed():.2f} s. "
                    "Expected more time (or None for no limit)."
                    if max_seconds is not None and all("budget" in c.reason for c in candidates)
                    else f"plan_batch_size: no candidate batch could be measured: {candidates[0].reason}"
                )
            best = chosen.per_device_batch_size
            method += (
                "; then each candidate timed with model.fit on one batch repeated (compile apart, then the steady "
                "state): the step's speed without your input pipeline's, which InputBoundDetector measures"
            )
    finally:
        backend.plan_restore(model, snapshot)
        restore_side_effects(model, side_effects)
    peak = next((t.peak_bytes for t in reversed(trials) if t.fits and t.batch_size == best), None)
    if global_batch_size is not None and best > 0:
        k = global_batch_size // (best * replicas)
        why += (
            f"; the global batch of {global_batch_size} runs as {k} micro-batches of {best * replicas}"
            if k > 1
            else f"; the global batch of {global_batch_size} runs whole"
        )
    plan = BatchPlan(
        batch_size=best * replicas,
        per_device_batch_size=best,
        devices=replicas,
        peak_mib=[p / 2**20 for p in (peak or [])],
        capacity_mib=[c / 2**20 for c in (capacities or [])],
        margin=margin,
        method=method,
        trials=trials,
        objective=objective,
        candidates=candidates,
        why=why,
        global_batch_size=global_batch_size,
        plan_seconds=budget.elapsed(),
    )
    if log_dir is not None and topology.is_chief:
        plan.write(log_dir)
    return plan


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
