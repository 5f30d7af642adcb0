"""ProfilerWindow's layer tables: the model's layer tree per fit, torch's layer ranges per window, one table per window."""

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
        self._unscope: Callable[[], None] | None = None
        self._why_not: dict[int, str] = {}  # by window start: why the window gets no table
        self._undrawn: list[LayerTable] = []  # tables whose chart is drawn when the fit ends
        self._lock = threading.Lock()

    def start_fit(self, model: Any) -> None:
        """The model's layer tree (once per fit: a model may change between fits)."""
        self._tree = layer_tree(model)
        objects: dict[int, tuple[Any, str]] = {}
        for layer in _walk(model, ""):
            objects.setdefault(id(layer[0]), layer)
        self._layers = [pair for pair in objects.values() if pair[1]]

    def start_window(self, profiler: Any, model: Any, start: int) -> None:
        """Puts the backend's per-layer ranges in place for the window starting at step ``start`` (torch)."""
        self.stop_window()
        self._unscope, why = profiler.scope_layers(model, self._layers)
        if why:
            self._why_not[start] = why

    def stop_window(self) -> None:
        unscope, self._unscope = self._unscope, None
        if unscope is not None:
            unscope()

    def analyze(self, capture: WindowCapture, writer: EventWriter | None, say: Callable[[str], None]) -> None:
        """The window's table from its trace (run off the training thread), written and said in one line."""
        why = self._why_not.pop(capture.start_step, "") or ("" if capture.files else "the window left no trace file")
        table = build_table(capture.start_step, capture.num_steps, capture.files, self._tree, why)
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
