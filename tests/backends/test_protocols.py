"""Every backend object satisfies every backend protocol, with the protocol's signatures.

Runs under any Keras backend: importing a backend module imports no framework.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from keras_gpu_tools import backends
from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.protocols import CONCERNS, ProfilerBackend, ProfilerSession, StepBackend


def members(proto: type) -> tuple[list[str], list[str]]:
    """The protocol's methods and data members, as it declares them."""
    methods = [n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")]
    data = [n for n in vars(proto).get("__annotations__", {}) if not n.startswith("_")]
    return methods, data


def shape(fn) -> list[tuple[str, object, bool]]:
    """A callable's parameters (``self`` left out) as (name, kind, has a default)."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in params]


def problems(obj, proto: type) -> list[str]:
    """What ``obj`` lacks of ``proto``, or does with another signature; empty where it satisfies it."""
    found = []
    methods, data = members(proto)
    for name in data:
        if not hasattr(obj, name):
            found.append(f"no attribute {name!r}")
    for name in methods:
        impl = getattr(obj, name, None)
        if not callable(impl):
            found.append(f"no method {name!r}")
        elif shape(impl) != shape(getattr(proto, name)):
            found.append(
                f"{name}{inspect.signature(impl)} differs from {name}{inspect.signature(getattr(proto, name))}"
            )
    if not found and not isinstance(obj, proto):
        found.append(f"isinstance(obj, {proto.__name__}) is False")
    return found


def backend_objects() -> list[tuple[str, object]]:
    """Each framework's ``BACKEND`` from the module ``backends`` names, and the backend with no GPU support."""
    out = [(name, importlib.import_module(module).BACKEND) for name, module in backends._MODULES.items()]
    return [*out, ("numpy", Backend("numpy"))]


@pytest.mark.parametrize("proto", CONCERNS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("name,obj", backend_objects(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_backend_satisfies_every_protocol(name, obj, proto):
    assert problems(obj, proto) == []


def test_backends_get_returns_the_modules_backend_objects():
    for name, module in backends._MODULES.items():
        assert backends.get(name) is importlib.import_module(module).BACKEND
        assert backends.get(name).name == name


@pytest.mark.parametrize("name", backends.supported())
def test_every_profiler_session_satisfies_the_session_protocol(name):
    session = backends.get(name).profiler()
    assert problems(session, ProfilerSession) == []
    assert isinstance(backends.get(name), ProfilerBackend)


def test_a_missing_method_or_another_signature_is_found():
    class Missing(Backend):
        sync = None  # not callable: as if the method were gone

    class Renamed(Backend):
        def step_caller(self, step_hook):  # another parameter name
            raise NotImplementedError

    class Extra(Backend):
        def execution_note(self, steps_per_execution: int, extra: int) -> str | None:  # one more parameter
            return None

    assert problems(Missing(), StepBackend) == ["no method 'sync'"]
    assert [p.split("(")[0] for p in problems(Renamed(), StepBackend)] == ["step_caller"]
    assert [p.split("(")[0] for p in problems(Extra(), StepBackend)] == ["execution_note"]

    class NoFlag:
        def __getattr__(self, name):
            if name == "traced_flops":
                raise AttributeError(name)
            return getattr(Backend(), name)

    assert problems(NoFlag(), StepBackend) == ["no attribute 'traced_flops'"]
    assert not isinstance(object(), StepBackend)
