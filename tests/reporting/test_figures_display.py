"""The figures the package returns show as pictures in Jupyter, with or without pyplot imported.

A bare ``matplotlib.figure.Figure`` has no display formatter until pyplot's
inline backend registers one; IPython then shows its repr
(``<Figure size 640x300 with 2 Axes>``). The test asks IPython's own display
machinery for the figures' PNG, in a fresh formatter that has no type printer
for Figure registered.
"""

import pytest

pytest.importorskip("matplotlib")
formatters = pytest.importorskip("IPython.core.formatters")

from keras_gpu_tools.memory.search import BatchPlan  # noqa: E402
from keras_gpu_tools.memory.throughput import Candidate  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def displayed(obj) -> dict:
    """What IPython's display machinery would send to Jupyter for `obj`: its data by MIME type."""
    data, _ = formatters.DisplayFormatter().format(obj)
    return data


def test_plan_plot_displays_as_a_png():
    candidates = [
        Candidate(b, b, True, measured=True, samples_per_sec=100.0 * b, step_seconds=0.01, peak_mib=10.0 * b)
        for b in (1, 2, 4)
    ]
    plan = BatchPlan(4, 4, 1, [], [], 0.1, "timed", objective="throughput", candidates=candidates)
    fig = plan.plot()
    assert formatters.PNGFormatter()(fig).startswith(PNG_MAGIC)
    assert displayed(fig)["image/png"].startswith(PNG_MAGIC)


def test_every_report_figure_displays_as_a_png():
    from tests.helpers.fake_report import fake_report

    figs = fake_report().figures()
    assert figs
    for name, fig in figs.items():
        assert displayed(fig).get("image/png", b"").startswith(PNG_MAGIC), name
