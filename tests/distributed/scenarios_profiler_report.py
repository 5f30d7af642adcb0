"""report() of ProfilerWindow's job windows (see ``launch.py``); each function returns a JSON-ready dict.

The fit is ``scenarios_profiler.profile_window`` itself: ``keras.Model.fit`` is
wrapped only to keep the callbacks it was given, for ``report(callbacks)``.
"""

from __future__ import annotations

from pathlib import Path

import keras
import scenarios_profiler


def profile_report(index: int, count: int, out: Path, **args) -> dict:
    """``scenarios_profiler.profile_window(**args)``, then the report of its callbacks (text, HTML, job windows)."""
    from keras_gpu_tools import report

    given = []
    fit = keras.Model.fit

    def keeping_callbacks(self, *a, **k):
        given.extend(k.get("callbacks") or [])
        return fit(self, *a, **k)

    keras.Model.fit = keeping_callbacks
    try:
        result = scenarios_profiler.profile_window(index, count, out, **args)
    finally:
        keras.Model.fit = fit
    rep = report(given)
    result.update(
        report_text=rep.text(),
        report_html=rep.html(),
        report_job_profiles=rep.data.job_profiles,
        report_process_count=rep.data.process_count,
    )
    return result
