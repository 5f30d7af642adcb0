"""What the rest of the package asks of a backend, one ``Protocol`` per concern.

Each framework's folder has a module per concern (``step.py``, ``profiler.py``,
``recovery.py`` with ``accumulate.py``, ``memory.py``, ``leaks.py``, ``planner.py``,
``topology.py``); its ``backend.py`` composes them into one object that
satisfies every protocol here, as the base :class:`~keras_gpu_tools.backends.base.Backend`
(no GPU support) does. A new backend implements these; a new method the package
calls is added here, to the base ``Backend`` and to each framework's module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from keras_gpu_tools.memory.idle import IdlePath
from keras_gpu_tools.memory.runners import EvalRunner, TrainRunner
from keras_gpu_tools.profiling.trace import TracerOptions
from keras_gpu_tools.runtime.topology import Topology

Stats = dict[int, tuple[float, float]]  # local GPU index -> (current bytes, peak bytes)


@runtime_checkable
class StepBackend(Protocol):
    """The step hook's calls (``runtime.step_hook``) and the step's FLOPs (``InputBoundDetector``)."""

    #: Whether the train function pulls its batches itself (TensorFlow, JAX);
    #: torch's fit() fetches them before calling it.
    fetches_inside_step: bool
    #: Whether the backend counts a step's FLOPs (JAX, TensorFlow: its traced program; torch: one real step).
    traced_flops: bool

    def sync(self, outputs: Any) -> None: ...

    def step_caller(self, hook: Any) -> Callable: ...

    def fetch_caller(self, hook: Any) -> Callable | None: ...

    def prepare_hook(self, hook: Any) -> None: ...

    def execution_note(self, steps_per_execution: int) -> str | None: ...

    def step_flops(self, train_function: Callable, specs: Any) -> tuple[float | None, str]: ...

    def shape_specs(self, args: Any) -> Any: ...

    #: Each counted op of one step as ``(scope name or layer path, FLOPs)``, and the count's source; None and
    #: why not where the backend cannot tell (the layer table's FLOPs per layer).
    def layer_flops(self, train_function: Callable, specs: Any) -> tuple[list[tuple[str, float]] | None, str]: ...

    def uses_tf32(self) -> bool: ...


@runtime_checkable
class ProfilerSession(Protocol):
    """One profiler session of a framework (see ``profiling.trace``)."""

    name: str
    #: Whether ``stop()`` must run on the thread that called ``start()`` (torch).
    owner_thread_only: bool
    #: The trace files the session writes (a glob).
    pattern: str

    def available(self) -> tuple[bool, str]: ...

    def start(self, run_dir: str, options: TracerOptions) -> None: ...

    def step(self, step_num: int) -> AbstractContextManager: ...

    def stop(self, outputs: Any = None) -> None: ...

    #: Puts a profiler range around each ``(layer, path)``'s calls for a window (torch): their removal, and
    #: why the window gets no layer table ("" when it does).
    def scope_layers(self, model: Any, layers: Sequence[tuple[Any, str]]) -> tuple[Callable[[], None], str]: ...


@runtime_checkable
class ProfilerBackend(Protocol):
    """The profiler window's call (``ProfilerWindow``)."""

    def profiler(self) -> ProfilerSession: ...


@runtime_checkable
class RecoveryBackend(Protocol):
    """What the OOM reducer runs instead of Keras's train, test and predict functions.

    The runners (``accumulation_runner``, ``eval_runner``) retry a batch as
    micro-batches (each framework's ``accumulate.py``); the ``*_call`` methods
    build the functions that fetch the batches and route them to a runner or
    Keras's own step (each framework's ``recovery.py``).
    """

    #: Whether the reducer's train function runs ``IdlePath.free`` batches unchecked (JAX, torch).
    counts_idle_batches: bool

    def reducer_problem(self, model: Any) -> str | None: ...

    def accumulation_runner(
        self, model: Any, original: Callable, mode: str = "accumulate", **kwargs: Any
    ) -> TrainRunner: ...

    def reducer_call(
        self, one: Callable, idle: IdlePath, runner: TrainRunner, steps_per_execution: int, replicas: int = 1
    ) -> Callable: ...

    def eval_runner(self, model: Any, kind: str, original: Callable, mode: str = "accumulate") -> EvalRunner: ...

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable: ...

    def hand_back_eval_state(self, model: Any, kind: str, state: Any) -> None: ...

    def check_late_error(self, model: Any) -> BaseException | None: ...

    def hand_back_state(self, model: Any, state: Any) -> None: ...


@runtime_checkable
class MemoryBackend(Protocol):
    """Device and allocator memory, and out-of-memory errors (GPU logger, OOM reducer, planner)."""

    #: Whether the memory a step needs can be predicted before running it (JAX).
    predicts_memory: bool

    def allocator_memory(self, indices: Iterable[int]) -> Stats: ...

    def device_memory(self) -> dict[str, Any]: ...

    def device_peaks(self) -> dict[int, tuple[float, float | None]]: ...

    def is_oom(self, exc: BaseException) -> bool: ...

    def oom_error(self, original: BaseException, message: str) -> BaseException | None: ...

    def explain_oom(
        self, error: BaseException | None, context: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, bytes]]: ...

    def start_memory_history(self) -> str | None: ...

    def stop_memory_history(self) -> None: ...


@runtime_checkable
class LeakBackend(Protocol):
    """What ``MemoryLeakDetector`` reads besides ``allocator_memory``: the allocator's cache, live tensors, traces."""

    #: The backend's words on its allocator's cache (what "reserved" is), or None.
    allocator_cache_note: str | None

    def allocator_reserved(self, indices: Iterable[int]) -> dict[int, float]: ...

    def allocator_readings(self, indices: Iterable[int]) -> tuple[Stats, dict[int, float]]: ...

    def live_tensors(self, heap: bool) -> tuple[int, float] | None: ...

    def compiled_functions(self, model: Any, names: tuple[str, ...] = ...) -> dict[int, int] | None: ...

    def trace_counter(self, model: Any, names: tuple[str, ...] = ...) -> Callable[[], dict[int, int] | None]: ...


@runtime_checkable
class PlannerBackend(Protocol):
    """Measuring a training step's memory for ``plan_batch_size`` (``planner.py``)."""

    #: Whether ``step_memory`` needs only the batch's shapes and dtypes (JAX: compiled, never run).
    plans_on_shapes: bool

    def device_capacities(self, model: Any, replicas: int) -> list[int | None]: ...

    def plan_snapshot(self, model: Any, batch: Any) -> Any: ...

    def plan_restore(self, model: Any, snapshot: Any) -> None: ...

    def forget_compiled_trials(self) -> None: ...

    def step_memory(self, model: Any, batch: Any, replicas: int) -> tuple[list[float], str]: ...

    def plan_method(self, model: Any) -> str: ...

    def rng_state(self) -> dict[str, Any]: ...

    def set_rng_state(self, state: dict[str, Any]) -> None: ...

    def plan_step_flops(self, model: Any, batch: Any, replicas: int) -> float | None: ...

    def plan_problem(self, model: Any, replicas: int, memory_search: bool) -> str | None: ...

    def repeated_batch(self, batch: tuple[Any, Any]) -> Any | None: ...


@runtime_checkable
class TopologyBackend(Protocol):
    """This process, its devices, data parallelism, and what ``doctor`` reports of the framework."""

    name: str
    #: Whether data parallelism needs every device's share of a batch to be equal (JAX).
    even_shares: bool
    #: What ``doctor`` tells a user whose framework build sees no GPU.
    install_hint: str

    def gpu_devices(self) -> list[str]: ...

    def replicas(self, model: Any) -> int: ...

    def topology(self, model: Any) -> Topology: ...

    def distribution_notes(self, topology: Topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]: ...

    def time_allreduce(self, model: Any, nbytes: int) -> tuple[float | None, str]: ...

    def framework_facts(self, facts: Any) -> None: ...


#: Every concern a backend object satisfies.
CONCERNS: tuple[type, ...] = (
    StepBackend,
    ProfilerBackend,
    RecoveryBackend,
    MemoryBackend,
    LeakBackend,
    PlannerBackend,
    TopologyBackend,
)
