"""The backend with no GPU support: the base every framework's backend builds on.

:class:`Backend` satisfies every protocol of :mod:`~keras_gpu_tools.backends.protocols`
with the behaviour of a backend that has no GPU, no step hook and no OOM of its
own (Keras's ``numpy`` or ``openvino``). Each framework's folder overrides, one
module per concern, what its framework does differently; keep the signatures
identical to the protocols'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from keras_gpu_tools.backends.protocols import ProfilerSession, Stats
from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.runners import EvalRunner, TrainRunner
from keras_gpu_tools.runtime.topology import Topology

FUNCTIONS = ("train_function", "test_function", "predict_function")  # the model's compiled functions


class Backend:
    """What keras_gpu_tools needs to know and do per Keras backend."""

    #: Whether the train function pulls its batches itself (TensorFlow, JAX);
    #: torch's fit() fetches them before calling it.
    fetches_inside_step = True
    #: Whether the backend counts a step's FLOPs (``step_flops``): from its traced program (JAX,
    #: TensorFlow) or while one real step runs (torch).
    traced_flops = False
    #: Whether the memory a step needs can be predicted before running it (JAX).
    predicts_memory = False
    #: Whether ``plan_batch_size``'s trial steps need only the batch's shapes and dtypes (JAX: compiled,
    #: never run), so that no host batch of a trial's size is built.
    plans_on_shapes = False
    #: Whether data parallelism needs every device's share of a batch to be equal
    #: (JAX: a global array is split evenly; tf.distribute splits unevenly).
    even_shares = False
    #: Whether the reducer's train function runs ``IdlePath.free`` batches unchecked (JAX, torch).
    #: TensorFlow's idle step costs less than Keras's own already, and keeps its check.
    counts_idle_batches = False
    #: What `doctor` tells a user whose framework build sees no GPU.
    install_hint = "install a GPU build of the framework"

    def __init__(self, name: str = "none"):
        self.name = name

    def __repr__(self) -> str:
        return f"<keras_gpu_tools backend {self.name!r}>"

    # -- the training step (StepBackend) -----------------------------------------------------------
    def sync(self, outputs) -> None:
        """Waits until the device has finished the work that produced ``outputs``."""

    def step_caller(self, hook) -> Callable:
        """The body of the step hook's wrapper: ``f(*train_function_args)`` (see ``step_hook``)."""
        raise ValueError(f"keras_gpu_tools: no step hook for the Keras backend {self.name!r}.")

    def fetch_caller(self, hook) -> Callable | None:
        """The step hook's light path, ``f(*train_function_args)``: Keras's step with only its fetch timed.

        None where a fetch cannot be timed without a device sync (TensorFlow
        fetches inside its compiled step); JAX and torch fetch in Python.
        """
        return None

    def prepare_hook(self, hook) -> None:
        """Called once when a step hook is installed (torch: time the epoch iterator's fetches)."""

    def execution_note(self, steps_per_execution: int) -> str | None:
        """What a sampled step means with ``steps_per_execution > 1``, where it differs from unsampled ones."""
        return None

    def step_flops(self, train_function: Callable, specs) -> tuple[float | None, str]:
        """FLOPs of one step and how they were counted (``specs``: what :meth:`shape_specs` returned)."""
        return None, ""

    def shape_specs(self, args):
        """Shape-only stand-ins of a sampled call's arguments, for :meth:`step_flops`."""
        return None

    def layer_flops(self, train_function: Callable, specs) -> tuple[list[tuple[str, float]] | None, str]:
        """Each counted op of one step, ``(scope name or layer path, FLOPs)``, and the count's source (or why none).

        The layer table groups the ops by the Keras layers their names carry
        (``profiling.layers.assign_flops``); they add up to the step's count.
        """
        return None, f"the {self.name} backend counts no FLOPs"

    def uses_tf32(self) -> bool:
        """Whether float32 matmuls run as TF32 (their peak FLOP/s is TF32's)."""
        return False

    # -- profiler (ProfilerBackend) ----------------------------------------------------------------
    def profiler(self) -> ProfilerSession:
        """A new profiler session (``available``, ``start``, ``step``, ``stop``); see ``profiling.trace``."""
        raise ValueError(f"keras_gpu_tools: no profiler for the Keras backend {self.name!r}.")

    # -- out-of-memory recovery (RecoveryBackend) --------------------------------------------------
    def reducer_problem(self, model) -> str | None:
        """Why the OOM reducer cannot run on ``model`` here, or None."""
        return f"OOMBatchSizeReducer: the Keras backend {self.name!r} is not supported (tensorflow, jax, torch)."

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs) -> TrainRunner:
        """The runner that retries a batch as micro-batches (see ``memory.accumulate``)."""
        raise ValueError(self.reducer_problem(model))

    def reducer_call(
        self, one: Callable, idle: IdlePath, runner: TrainRunner, steps_per_execution: int, replicas: int = 1
    ) -> Callable:
        """The train function the reducer runs: fetches the batch(es) and runs each on the idle path or ``one``.

        A batch whose signature is ``idle.signature`` (:class:`~keras_gpu_tools.memory.idle.IdlePath`)
        runs ``runner.original`` (Keras's step) whole, in a ``try``; any other
        goes to ``one(batch[, state])``, the reducer's guarded path. Where
        ``counts_idle_batches``, a batch fetched while ``idle.free`` is set runs
        unchecked, counted down (see ``IdlePath``).

        ``replicas``: the data-parallel size (:meth:`replicas`); under a ``tf.distribute`` strategy of
        several replicas the batches are per-replica values.
        """
        raise ValueError(f"OOMBatchSizeReducer: the Keras backend {self.name!r} is not supported.")

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate") -> EvalRunner:
        """The runner that retries an evaluation (``kind="test"``) or prediction (``"predict"``) batch, split."""
        raise ValueError(self.reducer_problem(model))

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        """The test or predict function the reducer runs: fetches the batch(es) and calls ``one(batch[, state])``.

        ``replicas``: as for :meth:`reducer_call`.
        """
        raise ValueError(f"OOMBatchSizeReducer: the Keras backend {self.name!r} is not supported.")

    def hand_back_eval_state(self, model, kind: str, state) -> None:
        """After a failed evaluation or prediction step, puts the state from before it into the model (JAX)."""

    def check_late_error(self, model) -> BaseException | None:
        """An error of an earlier asynchronous step that surfaces only when results are read (JAX)."""
        return None

    def hand_back_state(self, model, state) -> None:
        """After a failed step, gives fit() the state to write back into the model (JAX)."""

    # -- device memory and out of memory (MemoryBackend) -------------------------------------------
    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        """Current and peak bytes of the framework's allocator per local GPU index."""
        return {}

    def device_memory(self) -> dict[str, Any]:
        """The first GPU's ``device``, ``bytes_limit``, ``bytes_in_use``, ``peak_bytes_in_use`` (empty on CPU)."""
        return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        """Per local GPU: the allocator's peak bytes since the process started, and the device's capacity."""
        return {}

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this framework's out-of-memory error."""
        return False

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        """An error of ``original``'s type carrying ``message``, or None where it cannot be built."""
        return None

    def explain_oom(
        self, error: BaseException | None, context: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """What the framework can tell about an out-of-memory error, at the moment it happened.

        Returns ``(figures, artifacts)``: :class:`~keras_gpu_tools.memory.explain.OOMExplanation`
        field values from the allocator (memory in use, peak, limit, the
        largest buffers, the failing program's memory analysis), and files to
        write next to the event (name suffix -> bytes) when
        ``context["files"]`` is set. ``error`` is None for a failure predicted
        from a memory analysis (``context["predicted_need"]``).
        """
        return {}, {}

    def start_memory_history(self) -> str | None:
        """Starts recording the allocator's history of allocations; returns why it cannot, or None."""
        return f"the Keras backend {self.name!r} records no allocation history (torch with CUDA does)"

    def stop_memory_history(self) -> None:
        """Stops what :meth:`start_memory_history` started."""

    # -- memory over time (LeakBackend) ---------------------------------------------------------------
    #: The backend's words on its allocator's cache (what "reserved" is), or None.
    allocator_cache_note: str | None = None

    def allocator_reserved(self, indices: Iterable[int]) -> dict[int, float]:
        """Bytes the framework's allocator holds from each local GPU (in use or cached for reuse), where it says."""
        return {}

    def allocator_readings(self, indices: Iterable[int]) -> tuple[Stats, dict[int, float]]:
        """``allocator_memory(indices)`` and ``allocator_reserved(indices)`` together (one read where it can)."""
        return self.allocator_memory(indices), self.allocator_reserved(indices)

    def live_tensors(self, heap: bool) -> tuple[int, float] | None:
        """(count, bytes) of the framework's live tensors; None where unknown.

        Without ``heap`` only where the framework keeps a registry of its
        arrays (cheap); with it, a walk over the heap where it has none
        (tens of milliseconds: see ``leaks/census.py``).
        """
        return None

    def compiled_functions(self, model, names: tuple[str, ...] = FUNCTIONS) -> dict[int, int] | None:
        """Traces of each compiled function of the model's ``names`` functions (train/test/predict), by the function's id."""
        return None

    def trace_counter(self, model, names: tuple[str, ...] = FUNCTIONS) -> Callable[[], dict[int, int] | None]:
        """A reader of :meth:`compiled_functions` that finds the functions once (cheap to call per epoch)."""
        return lambda: self.compiled_functions(model, names)

    #: Whether Keras runs several steps per train-function call here (``steps_per_execution > 1``; not torch).
    several_steps_per_call = True

    #: What compiles the step under ``jit_compile=True``, as the words of a report name it.
    step_compiler = "XLA"

    #: Whether the training process may fork input workers (a `PyDataset`'s ``use_multiprocessing``).
    forks_safely = True

    #: The line that turns on the framework's persistent compilation cache of the step, for the advice.
    compile_cache_line: str | None = None

    def compiles_step(self, model) -> bool:
        """Whether the train step is compiled or traced (its first call and new shapes cost a compilation)."""
        return not bool(getattr(model, "run_eagerly", False))

    # -- planning the batch size (PlannerBackend) --------------------------------------------------
    def device_capacities(self, model, replicas: int) -> list[int | None]:
        """The memory of each of those devices (None where the device reports none, a CPU)."""
        return [None] * replicas

    def plan_snapshot(self, model, batch) -> Any:
        """Builds what a training step needs for ``batch`` and keeps a host copy of every variable and RNG state.

        The variables include the layers' `keras.random.SeedGenerator` states
        (non-trainable) and the metrics' (a fit's last results); the random
        states are Keras's global seed generator's, NumPy's and Python's, and
        the framework's own (:meth:`rng_state`).
        """
        from keras_gpu_tools.runtime import keras_internals as ki

        ki.build_for_training(model, batch)
        variables = [(v, self.host_value(v)) for v in ki.variables_of(model, "all")]
        return {"variables": variables, "rng": self.rng_state()}

    def plan_restore(self, model, snapshot) -> None:
        """Puts back what :meth:`plan_snapshot` kept (trial steps trained the model, and drew random numbers)."""
        model.reset_metrics()  # (first: it zeroes the metrics' variables, whose values are put back below)
        for v, value in snapshot["variables"]:
            self.assign_host_value(v, value)
        self.set_rng_state(snapshot["rng"])

    def forget_compiled_trials(self) -> None:
        """Drops what compiling trial clones left in the framework's caches (nothing to drop by default)."""

    def host_value(self, variable) -> Any:
        """A host copy of a Keras variable's value, as :meth:`assign_host_value` puts it back."""
        import keras

        return keras.ops.convert_to_numpy(variable.value)

    def assign_host_value(self, variable, value) -> None:
        variable.assign(value)

    def rng_state(self) -> dict[str, Any]:
        """The random states a training step may advance besides the model's variables (host copies)."""
        import random

        import keras
        import numpy as np

        from keras_gpu_tools.runtime import keras_internals as ki

        seeds = ki.global_seed_generator()
        return {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "keras": None if seeds is None else (seeds, keras.ops.convert_to_numpy(seeds.state.value)),
        }

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Puts back what :meth:`rng_state` returned."""
        import random

        import numpy as np

        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        if state["keras"] is not None:
            seeds, value = state["keras"]
            seeds.state.assign(value)

    def plan_problem(self, model, replicas: int, memory_search: bool) -> str | None:
        """Why ``model`` cannot be planned here (``memory_search``: peaks are measured), or None; asked first."""
        return None

    def plan_step_flops(self, model, batch, replicas: int) -> float | None:
        """The FLOPs of one training step on ``batch`` (shapes suffice), or None where unknown."""
        return None

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """The peak bytes of one training step on ``batch`` per device, and how they were obtained.

        ``batch`` is ``(x, y)`` of arrays, or of their shapes and dtypes only
        (:class:`~keras_gpu_tools.memory.search.ArraySpec`) where the backend
        ``plans_on_shapes``.
        """
        raise ValueError(f"plan_batch_size does not support the Keras backend {self.name!r} (tensorflow, jax, torch).")

    def plan_method(self, model) -> str:
        return ""

    def repeated_batch(self, batch: tuple[Any, Any]) -> Any | None:
        """``model.fit``'s ``x`` for one batch ``(x, y)`` repeated without end, where the framework has a cheaper
        way than the same host arrays yielded again; None: a Python generator of them serves."""
        return None

    # -- the job and its devices (TopologyBackend) -------------------------------------------------
    def gpu_devices(self) -> list[str]:
        """Names of the GPUs the framework sees (no framework import)."""
        return []

    def replicas(self, model) -> int:
        """The devices a batch is split over under data parallelism (1 without)."""
        return 1

    def topology(self, model) -> Topology:
        """This process's :class:`~keras_gpu_tools.runtime.topology.Topology` under the engine in use."""
        from keras_gpu_tools.runtime import topology

        return topology.single()

    def time_allreduce(self, model, nbytes: int) -> tuple[float | None, str]:
        """Seconds of one all-reduce of ``nbytes`` over the step's devices, timed alone, and how; None with why not."""
        return None, f"the {self.name} backend runs the step on one device: no all-reduce"

    def distribution_notes(self, topology: Topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        """What ``doctor`` says of scaling out with this framework: ``(level, text)`` pairs.

        ``topology`` is :meth:`topology` outside any fit (``model=None``),
        ``gpus`` the GPUs this process can see, ``env`` the environment.
        """
        return []

    def framework_facts(self, facts) -> None:
        """Fills ``doctor``'s :class:`FrameworkFacts` (version, GPUs, CUDA build) for this framework."""
        facts.error = f"backend {self.name!r} has no GPU support in this tool"
