"""The report of ``find_speedups``: its rows as text and Markdown, and ``apply`` for the compile-time changes.

Framework-free, but :meth:`SpeedupReport.apply`, which re-compiles the model (Keras is imported there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_gpu_tools.speedups.rows import BASELINE, CEILING, COMBINED, PAID, SpeedupRow

COMPILE_KINDS = ("steps_per_execution", "jit_compile")  # what apply() sets; the rest is code for the user
HEADER = ("change", "samples/s before", "after", "speed-up", "status", "numerical check", "code", "cost or note")


def _sps(value: float | None, uncertainty: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" + ("" if uncertainty is None else f" ±{100 * uncertainty:.1f}%")


def _cells(r: SpeedupRow) -> tuple[str, ...]:
    speedup = r.speedup
    note = r.reason or r.cost
    if r.reason and r.cost:
        note = f"{r.reason}; {r.cost}"
    return (
        r.change,
        _sps(r.before, r.before_uncertainty),
        _sps(r.after, r.after_uncertainty),
        "-" if speedup is None else f"{speedup:.2f}x",
        r.status,
        r.check or "-",
        r.code or "-",
        note or "-",
    )


@dataclasses.dataclass
class SpeedupReport:
    """What each known speed-up is worth on one model and its input.

    Attributes:
        rows: a :class:`SpeedupRow` per change, the baseline and the input-free ceiling first,
            the combination of the changes that paid last.
        backend: the Keras backend measured on.
        device: where the step ran (`"gpu"` or `"cpu"`).
        seconds: how long finding took, in seconds.
        max_seconds: the budget it was given.
    """

    rows: list[SpeedupRow]
    backend: str = ""
    device: str = ""
    seconds: float = 0.0
    max_seconds: float | None = None

    def row(self, kind: str) -> SpeedupRow | None:
        """The first row of ``kind`` (e.g. ``"steps_per_execution"``), or None."""
        return next((r for r in self.rows if r.kind == kind), None)

    @property
    def paid(self) -> list[SpeedupRow]:
        """The changes that paid, alone."""
        return [r for r in self.rows if r.status == PAID and r.kind != COMBINED]

    @property
    def taken(self) -> list[SpeedupRow]:
        """The changes to take: those that paid, or the one among them that alone ran faster than their
        combination (the others held it back)."""
        instead = self.combined.settings.get("instead") if self.combined is not None else None
        return [r for r in self.paid if r.change == instead] if instead else self.paid

    @property
    def combined(self) -> SpeedupRow | None:
        return next((r for r in self.rows if r.kind == COMBINED), None)

    @property
    def compile_args(self) -> dict[str, Any]:
        """The ``model.compile`` arguments of the compile-time changes to take: what :meth:`apply` sets."""
        out: dict[str, Any] = {}
        for r in self.taken:
            if r.kind in COMPILE_KINDS:
                out.update(r.compile_args)
        return out

    def code(self) -> list[str]:
        """The lines of code of every change to take (input and precision changes are the user's to make)."""
        return [r.code for r in self.taken if r.code]

    def apply(self, model) -> dict[str, Any]:
        """Re-compiles ``model`` with the compile-time changes to take (:attr:`taken`); returns them (empty: nothing changed).

        The model keeps its optimizer (the same instance, its state), its
        loss, metrics and other compile arguments. Input, precision and
        batch-size changes are not applied: they change the input pipeline,
        the model's definition or the optimisation, so they come as code
        (:meth:`code`).
        """
        from keras_gpu_tools.runtime import keras_internals as ki

        changes = self.compile_args
        if not getattr(model, "compiled", False):
            raise ValueError(
                "Invalid value for argument `model`. Received: a model that is not compiled. Expected the "
                "compiled model find_speedups measured."
            )
        if not changes:
            return {}
        args = ki.compile_arguments(model)
        args["optimizer"] = model.optimizer  # its state (slots, iterations) is kept
        args.update(changes)
        model.compile(**args)
        return changes

    def table(self) -> list[tuple[str, ...]]:
        """The rows' cells under :data:`HEADER`."""
        return [_cells(r) for r in self.rows]

    def summary(self) -> str:
        """One line: the baseline, the ceiling, what paid and the combination's speed-up."""
        base = next((r for r in self.rows if r.kind == BASELINE), None)
        ceiling = next((r for r in self.rows if r.kind == CEILING), None)
        parts = []
        if base is not None and base.after is not None:
            parts.append(f"baseline {_sps(base.after, base.after_uncertainty)} samples/s")
        if ceiling is not None and ceiling.after is not None:
            parts.append(f"input-free ceiling {_sps(ceiling.after, ceiling.after_uncertainty)}")
        names = [r.change for r in self.paid]
        parts.append("paid: " + (", ".join(names) if names else "none"))
        combined = self.combined
        if combined is not None and combined.speedup is not None:
            instead = combined.settings.get("instead")
            parts.append(
                f"combined {combined.speedup:.2f}x ({combined.status})" + (f": take {instead} alone" if instead else "")
            )
        return "; ".join(parts)

    def __str__(self) -> str:
        cells = [HEADER, *self.table()]
        widths = [min(60, max(len(c[i]) for c in cells)) for i in range(len(HEADER))]
        lines = [f"find_speedups ({self.backend}, {self.device}, {self.seconds:.1f} s): {self.summary()}"]
        for c in cells:
            lines.append("  ".join(v.ljust(w) for v, w in zip(c[:6], widths[:6])).rstrip())
        reasons = [f"  {r.change}: {r.reason}" for r in self.rows if r.reason]
        if reasons:
            lines.append("Why not:")
            lines.extend(reasons)
        code = self.code()
        if code:
            lines.append("To apply:")
            lines.extend(f"  {line}" for line in code)
        notes = [f"  {r.change}: {r.cost}" for r in self.taken if r.cost]
        if notes:
            lines.append("What they change:")
            lines.extend(notes)
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The report as a Markdown table (code in code spans) under its summary line."""

        def esc(v: str) -> str:
            return v.replace("|", "\\|")

        out = [f"**find_speedups** ({self.backend}, {self.device}, {self.seconds:.1f} s): {esc(self.summary())}", ""]
        out.append("| " + " | ".join(HEADER) + " |")
        out.append("|" + "---|" * len(HEADER))
        for c in self.table():
            row = list(c)
            row[6] = f"`{row[6]}`" if row[6] != "-" else "-"
            out.append("| " + " | ".join(esc(v) for v in row) + " |")
        return "\n".join(out)

    def write(self, log_dir: str) -> None:
        """Writes the report to TensorBoard, run `speedups` of ``log_dir``: its table (Text), bar chart (Images), speed-ups (Scalars)."""
        from keras_gpu_tools.speedups.figure import write

        write(self, log_dir)

    def plot(self) -> Any:
        """The bar chart of each measured change's speed-up (a matplotlib `Figure`, shown in Jupyter)."""
        from keras_gpu_tools.speedups.figure import figure

        return figure(self.rows)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeedupReport:
        """The report from :meth:`as_dict` (its JSON in a log directory); a KeyError or TypeError if not shaped so."""
        names = {f.name for f in dataclasses.fields(SpeedupRow)}
        rows = [SpeedupRow(**{k: v for k, v in r.items() if k in names}) for r in d["rows"]]
        return cls(rows, str(d.get("backend", "")), str(d.get("device", "")), float(d.get("seconds") or 0.0),
                   d.get("max_seconds"))  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "seconds": self.seconds,
            "max_seconds": self.max_seconds,
            "rows": [r.as_dict() for r in self.rows],
        }


__all__ = ["COMPILE_KINDS", "HEADER", "SpeedupReport"]
