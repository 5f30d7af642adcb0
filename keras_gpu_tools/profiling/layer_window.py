"""ProfilerWindow's layer tables: the model's layer tree per fit, torch's layer ranges per window, one table per window.

FLOPs per layer: during a window the step hook keeps one step's arguments
(``capture_args``: on torch that step runs inside the FLOP counter, with the
layer ranges in place); after the window, off the training thread, the backend
counts that step's ops by layer (``Backend.layer_flops``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.capture import WindowCapture
from keras_gpu_tools.profiling.layer_table import LayerTable, build_table, write_table
from keras_gpu_tools.profiling.layers import LayerNode, layer_tree
from keras_gpu_tools.runtime import keras_internals as ki


def _chart(table: LayerTable) -> tuple[bytes, int, int]:
    from keras_gpu_tools.profiling.layer_chart import chart_png

    return chart_png(table)


class LayerTables:
    """One fit's layer tree and every window's :class:`LayerTable` (by window start, in capture order)."""

    def __init__(self) -> None:
        self.tables: list[LayerTable] = []
        self._tree: LayerNode | None = None
        self._layers: list[tuple[Any, str]] = []
        self._model: Any = None
        self._unscope: Callable[[], None] | None = None
        self._why_not: dict[int, str] = {}  # by window start: why the window gets no table
        self._backend: Any = None
        self._hook: Any = None  # the step hook during a window whose step's arguments are still wanted
        self._asked = False  # whether the hook kept arguments before the window asked
        self._window = -1  # the start of the window that runs now
        self._specs: dict[int, tuple[Any, Any]] = {}  # by window start: (Keras's train function, step specs)
        self._undrawn: list[LayerTable] = []  # tables whose chart is drawn when the fit ends
        self._lock = threading.Lock()

    def start_fit(self, model: Any, backend: Any = None) -> None:
        """The model's layer tree (once per fit: a model may change between fits)."""
        self._tree, self._backend, self._model = layer_tree(model), backend, model
        objects: dict[int, tuple[Any, str]] = {}
        for layer in _walk(model, ""):
            objects.setdefault(id(layer[0]), layer)
        self._layers = [pair for pair in objects.values() if pair[1]]

    def start_window(self, profiler: Any, start: int, attachment: Any = None) -> None:
        """Puts the backend's per-layer ranges in place for the window starting at step ``start`` (torch).

        The model is the one of :meth:`start_fit`: a window starts inside a step, where JAX's
        ``Callback.model`` would sync the training state into the variables (and the step's donated
        state would be gone). With the step hook's ``attachment``, asks it for one step's arguments
        (FLOPs per layer).
        """
        self.stop_window()
        self._unscope, why = profiler.scope_layers(self._model, self._layers)
        if why:
            self._why_not[start] = why
        self._window = start
        if attachment is not None and attachment.active and getattr(self._backend, "traced_flops", False):
            self._hook, self._asked = attachment.hook, attachment.hook.capture_args
            self._hook.capture_args = True

    def wants_call(self, call: int) -> bool:
        """Whether the window's ``call``-th call (from 0) runs on the hook's full path for its arguments: its second."""
        return self._hook is not None and call == 1

    def on_step(self, record: Any) -> None:
        """Keeps the shapes of the window's first step whose arguments the hook kept (on the training thread)."""
        if self._hook is None or "step_args" not in record.extra:
            return
        hook, self._hook = self._hook, None
        hook.capture_args = False
        specs = self._backend.shape_specs(record.extra["step_args"])
        if specs is not None:
            self._specs[self._window] = (hook.original, specs)

    def stop_window(self) -> None:
        if self._hook is not None:  # no step's arguments came: the hook as it was (another callback may ask)
            self._hook.capture_args, self._hook = self._asked, None
        unscope, self._unscope = self._unscope, None
        if unscope is not None:
            unscope()

    def analyze(self, capture: WindowCapture, writer: EventWriter | None, say: Callable[[str], None]) -> None:
        """The window's table from its trace (run off the training thread), written and said in one line."""
        why = self._why_not.pop(capture.start_step, "") or ("" if capture.files else "the window left no trace file")
        step = self._specs.pop(capture.start_step, None)
        backend = self._backend

        def flops() -> tuple[list[tuple[str, float]] | None, str]:
            if step is not None:
                return backend.layer_flops(*step)
            if getattr(backend, "traced_flops", False):
                return None, (
                    "no step of the window was counted (a window of one call of the train function, or one cut short)"
                )
            return None, "this backend counts no FLOPs"

        table = build_table(capture.start_step, capture.num_steps, capture.files, self._tree, why, flops)
        with self._lock:
            self.tables.append(table)
            self._undrawn.append(table)
        say(table.line())
        write_table(writer, table, None)

    def draw_charts(self, writer: EventWriter | None) -> None:
        """Draws this fit's tables' charts as it ends (matplotlib takes a second at first use: never beside steps)."""
        with self._lock:
            tables, self._undrawn = self._undrawn, []
        for table in tables:
            write_table(writer, table, _chart, text=False)

    def table(self, window: int = -1) -> LayerTable | None:
        with self._lock:
            done = sorted(self.tables, key=lambda t: t.start_step)
        try:
            return done[window]
        except IndexError:
            return None


def _walk(layer: Any, path: str):
    yield layer, path
    for sub in ki.sublayers(layer):
        if type(sub).__name__ == "InputLayer":
            continue
        name = str(getattr(sub, "name", type(sub).__name__))
        yield from _walk(sub, f"{path}/{name}" if path else name)
