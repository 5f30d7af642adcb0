"""Every method of our callbacks that overrides a Keras hook or a base class's method says so (``@override``).

Type checkers then refuse a misspelt hook; where Keras is typed ``Any`` (no Keras in the lint phase) the
run-time check below does: a method marked ``@override`` must find the name in a base class.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import keras

import keras_gpu_tools.callbacks as package
from keras_gpu_tools.runtime import step_observer
from keras_gpu_tools.runtime.typing_compat import override

HOOKS = {"set_model", "set_params"}
# The step hook's observer methods (runtime/step_observer.py) are a structural protocol, not a base class.
OBSERVER_METHODS = {
    name
    for proto in vars(step_observer).values()
    if inspect.isclass(proto) and proto.__module__ == step_observer.__name__
    for name in vars(proto)
    if not name.startswith("_")
}


def our_callback_classes() -> list[type]:
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and issubclass(cls, keras.callbacks.Callback):
                found.add(cls)
    return sorted(found, key=lambda c: c.__qualname__)


def own_methods(cls: type) -> dict[str, object]:
    return {name: v for name, v in vars(cls).items() if inspect.isfunction(v) and not name.startswith("__")}


def test_every_callback_class_is_found():
    names = {c.__name__ for c in our_callback_classes()}
    assert {"LeanCallback", "FitCallback", *package.__all__} <= names
    assert {"on_step", "on_detach", "sample"} <= OBSERVER_METHODS


def test_every_hook_and_every_overriding_method_is_marked():
    missing = []
    for cls in our_callback_classes():
        for name, method in own_methods(cls).items():
            hook = (name.startswith("on_") or name in HOOKS) and name not in OBSERVER_METHODS
            overrides = any(name in vars(base) for base in cls.__mro__[1:])
            if (hook or overrides) and not getattr(method, "__override__", False):
                missing.append(f"{cls.__qualname__}.{name}")
    assert missing == [], f"add @override (keras_gpu_tools.runtime.typing_compat) to: {missing}"


def test_every_marked_method_overrides_something():
    stray = [
        f"{cls.__qualname__}.{name}"
        for cls in our_callback_classes()
        for name, method in own_methods(cls).items()
        if getattr(method, "__override__", False) and not any(hasattr(base, name) for base in cls.__mro__[1:])
    ]
    assert stray == [], f"marked @override but no base class has the name (misspelt?): {stray}"


def test_the_marker_is_kept_through_the_epoch_end_wrapper():
    from keras_gpu_tools.callbacks.memory_leak_detector import MemoryLeakDetector

    assert MemoryLeakDetector.on_epoch_end.__override__ is True  # (FitCallback wraps it with functools.wraps)
    assert override(lambda: None).__override__ is True
