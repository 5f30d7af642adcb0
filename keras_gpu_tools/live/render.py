"""The live view's logic: what to show during fit() and how to draw it cheaply.

Nothing here imports Keras, IPython or matplotlib at module level. The view is
one small HTML block (a header line, a table, inline SVG sparklines): drawing it
takes about half a millisecond and needs no plotting library. LiveView draws it
on the fit session's thread (``live/drawer.py``), where it still holds the GIL
while it runs: so it stays cheap.
"""

from __future__ import annotations

import functools
import html
import itertools
import math
import sys
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime import roles

SPARK_POINTS = 120  # points per sparkline (the latest ones)
VERDICT_EVERY_S = 2.0  # the run's verdict (made anew each epoch when read: it lists every epoch) read this often


def in_notebook() -> bool:
    """True inside a Jupyter kernel (notebook, JupyterLab, VS Code), False in a terminal or script."""
    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:
        return False
    try:
        shell = ipython_mod.get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class NotebookDisplay:
    """Shows one HTML block in the running cell and replaces it in place."""

    def __init__(self):
        from IPython.display import HTML, display

        self._html = HTML
        self._handle = display(HTML("<i>keras_gpu_tools: waiting for the first step...</i>"), display_id=True)

    def __call__(self, markup: str) -> None:
        self._handle.update(self._html(markup))


@functools.lru_cache(maxsize=64)
def _xs(width: int, n: int) -> tuple[str, ...]:
    """The x coordinates of a sparkline's ``n`` points, formatted (the same every redraw)."""
    return tuple(f"{2 + (width - 4) * i / (n - 1):.1f}," for i in range(n))


def sparkline(
    values: Sequence[float],
    width: int = 160,
    height: int = 28,
    color: str = "#1f77b4",
    low: float | None = None,
    high: float | None = None,
) -> str:
    """An inline SVG polyline of `values` (empty string for fewer than 2)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return ""
    lo = min(vals) if low is None else low
    hi = max(vals) if high is None else high
    span = (hi - lo) or 1.0
    top, inner = height - 2, height - 4
    pts = " ".join(
        f"{x}{top - inner * (min(max(v, lo), hi) - lo) / span:.1f}" for x, v in zip(_xs(width, len(vals)), vals)
    )
    return (
        f'<svg width="{width}" height="{height}" style="vertical-align:middle">'
        f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/></svg>'
    )


def _fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:,.{digits}f}{unit}"


class LiveState:
    """What the view shows, read from the other callbacks of the same fit()."""

    def __init__(self):
        self.gpu_logger: Any = None
        self.detector: Any = None
        self.oom: Any = None
        self.profiler: Any = None
        self.epochs: int | None = None
        self.epoch = 0
        self.step = 0
        self.started = 0.0
        self.logs: dict[str, Any] = {}
        self.loss_points: list[float] = []  # the loss at each redraw
        self.step_ms_points: list[float] = []
        self.last_steps: tuple[float, int] = (0.0, 0)
        self.done = False
        self.run_row: tuple[str, str, str] | None = None  # the detector's run verdict, as last read
        self.run_row_at = -math.inf  # when it was read

    def attach(self, callbacks: Sequence[Any]) -> None:
        for cb in callbacks:
            if isinstance(cb, roles.GPUSampler):
                self.gpu_logger = cb
            elif isinstance(cb, roles.InputVerdicts):
                self.detector = cb
            elif isinstance(cb, roles.ProfileCaptures):
                self.profiler = cb
            elif isinstance(cb, roles.MicroBatching):
                self.oom = cb

    def note_redraw(self, now: float) -> float | None:
        """Records the loss and the step rate since the last redraw; returns ms per step."""
        loss = self.logs.get("loss")
        try:
            loss = float(loss) if loss is not None else None  # converted here, every few seconds only
        except (TypeError, ValueError):
            loss = None
        if loss is not None and math.isfinite(loss):
            self.loss_points = (self.loss_points + [loss])[-SPARK_POINTS:]
        t_prev, s_prev = self.last_steps
        self.last_steps = (now, self.step)
        if t_prev and self.step > s_prev:
            ms = 1e3 * (now - t_prev) / (self.step - s_prev)
            self.step_ms_points = (self.step_ms_points + [ms])[-SPARK_POINTS:]
            return ms
        return None


def _tail(points: Sequence[Any], n: int) -> list[Any]:
    """The last ``n`` of ``points`` (a list or deque), without copying the rest."""
    try:
        return list(itertools.islice(reversed(points), n))[::-1]
    except RuntimeError:  # a deque the sampling thread added to meanwhile: a copy instead
        return list(points)[-n:]


def step_times(points: Sequence[tuple[float, int, dict[str, float]]]) -> list[float]:
    """Milliseconds per step between consecutive (wall time, step, ...) points."""
    out = []
    for (w0, s0, _), (w1, s1, _) in zip(points, points[1:]):
        if s1 > s0 and w1 > w0:
            out.append(1e3 * (w1 - w0) / (s1 - s0))
    return out


def _input_rows(det: Any, state: LiveState, now: float) -> list[tuple[str, str, str]]:
    """The detector's rows: the last window's input wait (its steps named), and the run's verdict so far.

    Every figure is the detector's own, worded by its verdicts (``Verdict.figure()``), so the view
    says what the detector, ProfilerWindow and the report say for the same steps. The run's verdict
    is read at most every ``VERDICT_EVERY_S`` (after an epoch, reading it makes it, over every
    epoch so far: milliseconds late in a long fit), and at the end of training.
    """
    e = html.escape
    rows: list[tuple[str, str, str]] = []
    wv = _tail(getattr(det, "window_verdicts", []) or [], SPARK_POINTS)
    hist = _tail(getattr(det, "epoch_history", []) or [], 1)
    if wv:
        fig = wv[-1][1].figure()
        spark = [100 * (x.wait_fraction or 0.0) for _, x in wv]
        rows.append((f"input wait, {fig.span}", e(fig.short()), sparkline(spark, low=0, high=100, color="#d62728")))
    elif hist:
        frac = hist[-1].get(schema.INPUT_WAIT_FRACTION)
        rows.append(("input wait (last epoch)", _fmt(None if frac is None else 100 * frac, "%", 1), ""))
    if state.done or now - state.run_row_at >= VERDICT_EVERY_S:
        state.run_row_at = now
        try:
            run = det.verdict  # made once per epoch, when first read
        except Exception:
            run = None
        state.run_row = None
        if run is not None and run.wait_fraction is not None:
            fig = run.figure()
            state.run_row = (
                f"run verdict ({fig.span})",
                e(fig.short()),
                "InputBoundDetector's; the windows are its parts",
            )
    if state.run_row is not None:
        rows.append(state.run_row)
    if hist and schema.SAMPLES_PER_SEC in hist[-1]:
        rows.append(("samples/s (last epoch)", _fmt(hist[-1][schema.SAMPLES_PER_SEC], "", 0), ""))
    if hist and schema.STEP_STEP_MS in hist[-1]:
        rows.append(("step breakdown (last epoch)", e(breakdown_line(hist[-1])), ""))
    return rows


_BREAKDOWN_PARTS = (
    (schema.STEP_INPUT_MS, "input"),
    (schema.STEP_DISPATCH_MS, "dispatch"),
    (schema.STEP_COMPUTE_MS, "compute"),
    (schema.STEP_COLLECTIVE_MS, "collectives"),
    (schema.STEP_OTHER_MS, "other"),
)


def breakdown_line(logs: dict[str, float]) -> str:
    """An epoch's step breakdown in one line: ``compute 4.2 · input 1.5 · other 0.3 of 6.0 ms; compile 0.33 s, 1 retrace``."""
    parts = sorted(((logs[k], name) for k, name in _BREAKDOWN_PARTS if k in logs), reverse=True)
    text = " · ".join(f"{name} {v:.1f}" for v, name in parts) + f" of {logs[schema.STEP_STEP_MS]:.1f} ms"
    if logs.get(schema.STEP_COMPILE_SECONDS) or logs.get(schema.STEP_RETRACES):
        n = int(logs.get(schema.STEP_RETRACES, 0))
        text += f"; compile {logs.get(schema.STEP_COMPILE_SECONDS, 0.0):.2f} s, {n} retrace{'' if n == 1 else 's'}"
    return text


def render(state: LiveState, now: float) -> str:
    """The view's HTML: a header and a table; never raises for missing data."""
    e = html.escape
    elapsed = max(0.0, now - state.started)
    loss = state.loss_points[-1] if state.loss_points else None
    head = (
        f"<b>{'Done' if state.done else 'Training'}</b> &middot; epoch {state.epoch + 1}"
        f"{'/' + str(state.epochs) if state.epochs else ''} &middot; step {state.step} &middot; {elapsed:.0f} s"
        + (f" &middot; loss {loss:.4g}" if loss is not None else "")
    )
    rows: list[tuple[str, str, str]] = []
    lg = state.gpu_logger
    points = []
    if lg is not None:
        try:
            points = _tail(lg.timeline, SPARK_POINTS)
        except Exception:
            points = []
    # Step time: from the GPU logger's points (one per sampling interval) where
    # there is one, else from this view's own redraws.
    step_ms_points = step_times(points) if len(points) > 2 else []
    if len(step_ms_points) < 2:
        step_ms_points = state.step_ms_points
    step_ms = step_ms_points[-1] if step_ms_points else None
    label = "step time"
    # Once an epoch ended, the detector's figure for it (what History, TensorBoard and the report
    # give); the sparkline stays the live rate between pictures.
    last = _tail(getattr(state.detector, "epoch_history", []) or [], 1) if state.detector is not None else []
    if last and last[-1].get(schema.INPUT_STEP_MS) is not None:
        step_ms, label = last[-1][schema.INPUT_STEP_MS], "step time (last epoch)"
    rows.append((label, _fmt(step_ms, " ms", 2), sparkline(step_ms_points, low=0, color="#555")))
    if state.loss_points:
        rows.append(("loss", _fmt(loss, "", 4), sparkline(state.loss_points, color="#9467bd")))

    if lg is not None:
        latest = points[-1][2] if points else {}
        indices = [str(i) for i, _ in (getattr(lg, "gpus", None) or [])]
        for i in indices:
            util_key = (
                schema.gpu_key(i, "sm_activity_percent")
                if schema.gpu_key(i, "sm_activity_percent") in latest
                else schema.gpu_key(i, "utilization_percent")
            )
            util = [p[2].get(util_key) for p in points]
            used, total = (
                latest.get(schema.gpu_key(i, "memory_used_mib")),
                latest.get(schema.gpu_key(i, "memory_total_mib")),
            )
            what = "SM activity" if "sm_activity" in util_key else "utilization"
            rows.append(
                (
                    f"GPU {i} {what}",
                    _fmt(latest.get(util_key), "%", 0),
                    sparkline(util, low=0, high=100, color="#2ca02c"),
                )
            )
            mem = [p[2].get(schema.gpu_key(i, "memory_used_mib")) for p in points]
            rows.append(
                (
                    f"GPU {i} memory",
                    f"{_fmt(used, '', 0)} / {_fmt(total, ' MiB', 0)}",
                    sparkline(mem, low=0, high=total, color="#ff7f0e"),
                )
            )
        if not indices:
            cpu = [p[2].get(schema.HOST_CPU_PERCENT) for p in points]
            rows.append(
                (
                    "host CPU (no GPU)",
                    _fmt(latest.get(schema.HOST_CPU_PERCENT), "% of one core", 0),  # the process's, may pass 100
                    sparkline(cpu, low=0, color="#2ca02c"),
                )
            )

    det = state.detector
    if det is not None:
        rows += _input_rows(det, state, now)

    oom = state.oom
    if oom is not None:
        n = None
        for attr in ("recoveries", "events", "records"):
            recs = getattr(oom, attr, None)
            if isinstance(recs, (list, tuple)):
                n = len(recs)
                break
        mb = getattr(oom, "micro_batches", None)
        rows.append(
            ("OOM recoveries", "-" if n is None else str(n), f"micro-batches: {e(str(mb))}" if mb is not None else "")
        )

    prof = state.profiler
    if prof is not None:
        caps = list(getattr(prof, "captures", []) or [])
        window = ""
        if caps:  # the window's input wait beside xprof's, once both are known; else where its trace is
            found = getattr(caps[-1], "input", None)
            window = (
                found.text.split("\n")[0] if found is not None else caps[-1].line() if hasattr(caps[-1], "line") else ""
            )
        rows.append(("profiler windows", str(len(caps)), e(window.removeprefix("ProfilerWindow: ")[:200])))

    body = "".join(
        f'<tr><td style="padding:1px 8px 1px 0;color:#555">{e(a)}</td>'
        f'<td style="padding:1px 8px;text-align:right;font-variant-numeric:tabular-nums">{b}</td><td>{c}</td></tr>'
        for a, b, c in rows
    )
    return (
        f'<div class="kgt-live" style="font-family:sans-serif;font-size:12px">{head}'
        f'<table style="border-collapse:collapse;margin-top:3px">{body}</table></div>'
    )
