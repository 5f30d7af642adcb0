"""report() of a job of several JAX processes (see ``launch.py``); each returns a JSON-ready dict.

The fit is ``scenarios_detector.fit_job`` itself: ``keras.Model.fit`` is
wrapped only to keep the callbacks it was given, for ``report(callbacks)``.
"""

from __future__ import annotations

from pathlib import Path

import keras
import scenarios_detector


def detector_report(index: int, count: int, out: Path, **args) -> dict:
    """``scenarios_detector.fit_job(**args)``, then the report of its callbacks (text and HTML)."""
    from keras_gpu_tools import report

    given = []
    fit = keras.Model.fit

    def keeping_callbacks(self, *a, **k):
        given.extend(k.get("callbacks") or [])
        return fit(self, *a, **k)

    keras.Model.fit = keeping_callbacks
    try:
        result = scenarios_detector.fit_job(index, count, out, **args)
    finally:
        keras.Model.fit = fit
    rep = report(given)
    result.update(report_text=rep.text(), report_html=rep.html(), report_job_verdict=rep.data.job_verdict)
    return result
