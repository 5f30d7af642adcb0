"""What the sections ask of the sources given to `report()`: which callback or Keras object one is.

The classes are imported only once Keras is loaded (no instance of them exists before), so that
the report imports neither Keras nor a framework at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from keras_gpu_tools.reporting.model import ReportData


def keras_loaded() -> bool:
    """Whether Keras is imported (else no source is a callback, a History or a model)."""
    return "keras" in sys.modules


def is_model(source: Any) -> bool:
    if not keras_loaded():
        return False
    import keras

    return isinstance(source, keras.Model)


def history_of(source: Any) -> dict[str, list[Any]] | None:
    """Keras's per-epoch logs in `source`: `history.history` itself, or a `History`'s."""
    if isinstance(source, dict) and all(isinstance(v, list) for v in source.values()):
        return source
    if keras_loaded():
        import keras

        if isinstance(source, keras.callbacks.History):
            return source.history
    return None


def flatten(sources: Iterable[Any]) -> list[Any]:
    """`sources` with nested lists and tuples spread out and `None`s left out."""
    out = []
    for s in sources:
        if isinstance(s, (list, tuple)):
            out.extend(flatten(s))
        elif s is not None:
            out.append(s)
    return out


def set_processes(data: ReportData, source: Any, only_if_unset: bool = True) -> None:
    """The process of a job that `source` ran in (its ``topology``), where the job has several."""
    topology = getattr(source, "topology", None)
    if topology is not None and topology.process_count > 1 and not (only_if_unset and data.processes):
        data.processes, data.process_count = [topology.process_index], topology.process_count


# The package's callbacks, as the sections read them: each returns `source` where it is one (a
# subclass counts), else None. What the report reads of each is the small interface of its Protocol.


class GPULoggerRecords(Protocol):
    """What the report reads of a `GPUUtilizationLogger` (and its optional ``topology``, and ``unsupported_fields``:
    the fields its GPUs cannot report, ``{gpu label: {field: reason}}``)."""

    epoch_history: Sequence[dict[str, Any]]  # per epoch: the logged figures, job-wide ones included
    timeline: Sequence[tuple[float, int, dict[str, float]]]  # (wall time, step, mean of each key)

    def device_records(self) -> list[dict[str, Any]]: ...


class DetectorRecords(Protocol):
    """What the report reads of an `InputBoundDetector` (and its optional ``fit_measurement``,
    ``breakdown``, ``job_verdict``, ``topology``)."""

    epoch_history: Sequence[dict[str, Any]]
    measurement: Any  # a Measurement (its `logs()`), or None
    verdict: Any  # a Verdict, or None

    def summary(self) -> str: ...


class ProfilerRecords(Protocol):
    """What the report reads of a `ProfilerWindow` (and its optional ``topology``)."""

    captures: Sequence[Any]  # WindowCapture records

    def wait_for_analysis(self, timeout: float) -> Any: ...

    def layer_table(self, window: int = -1) -> Any: ...  # the last window's LayerTable (or None)


class OOMRecords(Protocol):
    """What the report reads of an `OOMBatchSizeReducer`."""

    events: Sequence[Any]  # OOMEvent records (their `line()` and `why()`)
    micro_batches: int
    recovery_seconds: float

    def headroom(self) -> Any: ...


class LeakRecords(Protocol):
    """What the report reads of a `MemoryLeakDetector`."""

    epoch_history: Sequence[dict[str, Any]]  # per epoch: the memory/ figures
    verdict: Any  # a LeakVerdict, or None

    def fit_history(self) -> list[dict[str, Any]]: ...


def gpu_logger(source: Any) -> GPULoggerRecords | None:
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger

    return source if isinstance(source, GPUUtilizationLogger) else None


def input_detector(source: Any) -> DetectorRecords | None:
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    return source if isinstance(source, InputBoundDetector) else None


def leak_detector(source: Any) -> LeakRecords | None:
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector

    return source if isinstance(source, MemoryLeakDetector) else None


def profiler(source: Any) -> ProfilerRecords | None:
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.profiler_window import ProfilerWindow

    return source if isinstance(source, ProfilerWindow) else None


def oom_reducer(source: Any) -> OOMRecords | None:
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer

    return source if isinstance(source, OOMBatchSizeReducer) else None


def mixed_precision_check(source: Any) -> Any | None:
    """A `MixedPrecisionCheck` (its ``findings``)."""
    if not keras_loaded():
        return None
    from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck

    return source if isinstance(source, MixedPrecisionCheck) else None


def name_of(source: Any) -> str:
    """A callback's name in the report's "From:" line: its class's."""
    return type(source).__name__
