"""The step hook's observer protocol: every callback that observes steps has what the hook calls, as typed."""

import inspect

import pytest

from keras_gpu_tools.callbacks import InputBoundDetector, OOMBatchSizeReducer, ProfilerWindow
from keras_gpu_tools.runtime import step_observer

REQUIRED = step_observer.StepObserver
OPTIONAL = (
    step_observer.SchedulesSamples,
    step_observer.SchedulesFetches,
    step_observer.WrapsSteps,
    step_observer.ReplacesStep,
    step_observer.NotifiedOnDetach,
)


def methods(protocol) -> dict:
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)}


def parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_each_optional_method_has_a_protocol_of_its_own():
    assert set(methods(REQUIRED)) == {"sample", "on_step"}
    assert all(len(methods(p)) == 1 for p in OPTIONAL)


@pytest.mark.parametrize("cls", [InputBoundDetector, OOMBatchSizeReducer, ProfilerWindow])
def test_observers_take_what_the_hook_passes(cls):
    for protocol in (REQUIRED, *OPTIONAL):
        for name, typed in methods(protocol).items():
            method = getattr(cls, name, None)
            if method is None:
                assert protocol is not REQUIRED, f"{cls.__name__} has no `{name}`"
                continue
            assert len(parameters(method)) == len(parameters(typed)), f"{cls.__name__}.{name}"
