"""The roles in which the package's callbacks find each other among a fit's callbacks.

A callback that looks for another (``LiveView`` for what it shows, ``ProfilerWindow`` for the
detector's thresholds) asks ``isinstance(cb, Role)`` of one of these Protocols, never for a class
name or a loose attribute. Each names exactly what the finder reads. Each callback that plays a
role inherits it explicitly, and ``keras_gpu_tools.callbacks.roles.declared()`` lists them where
mypy checks that the class defines every member: renaming one fails type checking instead of
silently turning the feature off. ``runtime_checkable``: an object that is not a subclass but has
every member (a test double) is found as well.

Imports nothing but ``typing``: every layer may ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GPUTimeline(Protocol):
    """A GPU logger's points ``(wall time, step, {key: mean})``: what a verdict quotes."""

    timeline: Iterable[tuple[float, int, dict[str, float]]]


@runtime_checkable
class GPUSampler(GPUTimeline, Protocol):
    """A GPU logger as the live view shows it: its points and the GPUs it samples, ``(index, info)``."""

    gpus: Sequence[Any]


@runtime_checkable
class InputVerdicts(Protocol):
    """An input-bound detector as the live view shows it: the run's verdict and each window's."""

    @property
    def verdict(self) -> Any: ...  # a Verdict, or None

    @property
    def window_verdicts(self) -> Any: ...  # [(global step, Verdict)]


@runtime_checkable
class InputThresholds(Protocol):
    """An input-bound detector's thresholds of input wait (fractions), which ProfilerWindow judges its windows by."""

    moderate_threshold: float
    high_threshold: float


@runtime_checkable
class ProfileCaptures(Protocol):
    """A profiler callback as the live view shows it: its windows captured so far."""

    captures: Sequence[Any]  # WindowCapture records


@runtime_checkable
class MicroBatching(Protocol):
    """An out-of-memory reducer as the live view shows it: the micro-batches per batch now."""

    @property
    def micro_batches(self) -> int: ...
