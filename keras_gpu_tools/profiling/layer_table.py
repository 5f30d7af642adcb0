"""A profiled window's time per Keras layer: built from its trace off the training thread, written for TensorBoard.

TensorBoard gets it under ``profile/steps_<first>_<last>/layers`` as a Markdown table
(text), ``.../layers/data`` as JSON (for the report) and ``.../layers/chart``
as a bar chart image (with matplotlib).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.profiling.capture import copies_sentence, steps_name
from keras_gpu_tools.profiling.layer_trace import TraceOps, torch_ops, xplane_ops
from keras_gpu_tools.profiling.layers import OUTSIDE, LayerNode, LayerRow, OpTime, assign_flops, attribute

logger = logging.getLogger("keras_gpu_tools")

#: Rows a text table or chart shows (the heaviest; the JSON keeps every row).
SHOWN_ROWS = 15


@dataclass
class LayerTable:
    """Time per Keras layer in one profiled window, heaviest first (see ``ProfilerWindow.layer_table``)."""

    start_step: int
    num_steps: int
    rows: list[LayerRow] = field(default_factory=list)
    total_ms_per_step: float | None = None  # every op the trace counts, per step (copies apart)
    copy_ms_per_step: float | None = None  # copies between host and device, per step (None: none traced)
    source: str = ""  # "device kernels" (a GPU) or "host ops" (a CPU)
    note: str = ""  # what the table cannot tell (e.g. nothing in a layer: a compiled torch step)
    error: str = ""  # why there is no table
    seconds: float | None = None  # how long the analysis took
    flops_per_step: float | None = None  # the step's counted FLOPs, which the rows' FLOPs add up to
    flops_source: str = ""  # how they were counted, or why no row has FLOPs

    def text(self, limit: int = SHOWN_ROWS) -> str:
        """The table as Markdown (TensorBoard's text tab renders it), or why there is none."""
        head = f"Time per layer, {steps_name(self.start_step, self.num_steps)}"
        if self.error:
            return f"{head}: none ({self.error})." + (f"\n\n{self.note}" if self.note else "")
        peaks = any(r.peak_activation_bytes is not None for r in self.rows)  # torch's allocator, where traced
        lines = [
            f"{head} ({self.source}; {self.total_ms_per_step or 0:.3f} ms per step in all):",
            "",
            "| layer | calls | ms/step | share | forward ms | backward ms | FLOPs/step |"
            + (" peak MiB |" if peaks else ""),
            "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peaks else ""),
        ]
        for r in self.rows[:limit]:
            flops = "-" if r.flops_per_step is None else f"{r.flops_per_step:.3g}"
            peak = "-" if r.peak_activation_bytes is None else f"{r.peak_activation_bytes / 2**20:.2f}"
            lines.append(
                f"| {r.path} | {r.calls or '-'} | {r.ms_per_step:.3f} | {100 * r.share:.1f}% | "
                f"{r.forward_ms:.3f} | {r.backward_ms:.3f} | {flops} |" + (f" {peak} |" if peaks else "")
            )
        if len(self.rows) > limit:
            lines.append(f"| ... {len(self.rows) - limit} more | | | | | | |" + (" |" if peaks else ""))
        if self.copy_ms_per_step is not None:
            lines += ["", copies_sentence(self.copy_ms_per_step)]
        if self.flops_per_step is not None:
            lines += ["", f"FLOPs/step: {self.flops_per_step:.3g} in all, forward and backward ({self.flops_source})."]
        if peaks:
            lines += [
                "",
                "Peak MiB: the allocator's highest rise inside the layer's forward range (sublayers included).",
            ]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)

    def line(self) -> str:
        """One line for the terminal: the heaviest layer and its share."""
        head = f"ProfilerWindow: {steps_name(self.start_step, self.num_steps)}: time per layer"
        if self.error:
            return f"{head}: none ({self.error})." + (f"\n\n{self.note}" if self.note else "")
        top = [r for r in self.rows if r.path != OUTSIDE][:3]
        if not top:
            return f"{head}: no op in a layer. {self.note}".rstrip()
        parts = ", ".join(f"{r.path} {100 * r.share:.0f}% ({r.ms_per_step:.2f} ms)" for r in top)
        return f"{head}: {parts} (layer_table() for all)."


def build_table(
    start_step: int,
    num_steps: int,
    files: Sequence[str],
    tree: LayerNode | None,
    why_not: str = "",
    flops: Callable[[], tuple[list[tuple[str, float]] | None, str]] | None = None,
) -> LayerTable:
    """The window's table from its trace files and the model's layer tree (never raises: ``error`` says why not).

    ``flops()``: one step's counted ops ``(scope name or layer path, FLOPs)``
    and their source, or None and why not (``Backend.layer_flops``).
    """
    table = LayerTable(start_step, num_steps)
    t0 = time.perf_counter()
    try:
        if why_not or tree is None:
            table.error = why_not or "the model's layers are unknown"
            return table
        xplanes = [f for f in files if f.endswith(".xplane.pb")]
        torch_files = [f for f in files if f.endswith(".pt.trace.json")]
        if not xplanes and not torch_files:
            table.error = "the window left no trace file"
            return table
        found: TraceOps = xplane_ops(xplanes) if xplanes else torch_ops(torch_files)
        steps = found.steps or num_steps
        ops, copy_ps = split_copies(found.ops)
        table.rows, table.total_ms_per_step = attribute(ops, tree, steps, found.calls)
        table.copy_ms_per_step = None if copy_ps is None else copy_ps / max(1, steps) / 1e9
        if found.peaks is not None:  # the allocator's, where the trace has it (torch): never for a row it has not
            for row in table.rows:
                row.peak_activation_bytes = found.peaks.get(row.path)
        table.source = found.source
        if not ops:
            table.error = "the trace has no op times (a device tracer off, or steps that ran nothing)"
        elif all(r.path == OUTSIDE for r in table.rows):  # nothing measured per layer: no rows of 0 ms
            table.error = (
                f"no op of the trace ({found.source}) carries a layer's name, so time cannot be booked to "
                "layers: a compiled torch step (jit_compile=True), a train_step that calls no layer, or a "
                "trace without name-scope metadata (an older JAX, a custom op)"
            )
            table.rows = []
            if flops is not None:  # no rows to count FLOPs into: only why there are none, if so
                try:
                    named, source = flops()
                except Exception as e:  # a count this backend could not make: the error above stands
                    named, source = None, f"the count failed ({type(e).__name__}: {e})"
                if named is None:
                    table.note = f"FLOPs per layer: none ({source})."
        if flops is not None and table.rows:
            _add_flops(table, tree, flops)
    except Exception as e:  # a trace this reader does not know: said, training goes on
        logger.debug("ProfilerWindow: the layer table could not be built", exc_info=True)  # said in table.error
        table.error = f"the trace could not be read ({type(e).__name__}: {e})"
    finally:
        table.seconds = time.perf_counter() - t0
    return table


def split_copies(ops: list[OpTime]) -> tuple[list[OpTime], float | None]:
    """The ops without copies between host and device, and the copies' picoseconds in the profiled steps.

    Where ops know their step (torch), only the copies inside the steps count. None: no copy traced.
    """
    copies = [op for op in ops if op.copy]
    if not copies:
        return ops, None
    stepped = any(op.step is not None for op in ops)
    return [op for op in ops if not op.copy], float(sum(op.ps for op in copies if not stepped or op.step is not None))


def _add_flops(table: LayerTable, tree: LayerNode, flops: Callable) -> None:
    """The rows' FLOPs per step from the backend's count; where there is none, why (once, in the note)."""
    try:
        named, source = flops()
    except Exception as e:  # a count this backend could not make: said, the times stand
        logger.debug("ProfilerWindow: FLOPs per layer could not be counted", exc_info=True)
        named, source = None, f"the count failed ({type(e).__name__}: {e})"
    if named is None:
        for r in table.rows:
            r.flops_per_step = None
        table.flops_source = source
        note = f"FLOPs per layer: none ({source})."
        table.note = f"{table.note}\n\n{note}" if table.note else note
        return
    table.flops_per_step = assign_flops(table.rows, named, tree)
    table.flops_source = source


def write_table(
    writer: EventWriter | None, table: LayerTable, chart: Callable[[LayerTable], tuple] | None, text: bool = True
) -> None:
    """The table as text and JSON under ``profile/steps_<first>_<last>/layers`` (``text``), its chart (``chart(table)``)."""
    if writer is None:
        return
    tag = schema.profile_layers(table.start_step, table.start_step + table.num_steps)
    if text:
        writer.text(tag, table.text(), step=table.start_step)
        writer.json(tag + schema.DATA_SUFFIX, table, step=table.start_step)
    if chart is not None and table.rows:
        try:
            png, width, height = chart(table)
        except ImportError:  # no matplotlib: the text table says the same
            return
        writer.image(tag + schema.LAYERS_CHART_SUFFIX, png, table.start_step, width, height)
