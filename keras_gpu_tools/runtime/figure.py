"""The matplotlib figure the package returns: one that shows itself in Jupyter.

The package draws on ``matplotlib.figure.Figure``, not pyplot, so that no
figure is left open in pyplot's global registry. IPython shows such a figure
as a picture only where pyplot's inline backend registered a formatter for
the Figure type, which it does once pyplot is imported; before that a cell
ending in ``plan.plot()`` shows ``<Figure size 640x300 with 2 Axes>``.
:class:`ShownFigure` carries ``_repr_png_``, which IPython's display
machinery calls on its own, so the figure shows as a PNG either way.

This module imports matplotlib: import it inside the functions that draw.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure


class ShownFigure(Figure):
    """A ``matplotlib.figure.Figure`` that IPython and Jupyter display as a PNG."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=self.dpi)
        return buf.getvalue()


__all__ = ["ShownFigure"]
