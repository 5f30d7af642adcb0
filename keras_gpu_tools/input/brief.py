"""The detector's few plain lines for the terminal: the verdict in one sentence, and where the details are.

The whole report (tables, phases, advice) is ``InputBoundDetector.summary()``,
TensorBoard's text and the training report; the terminal gets one line per
verdict, well under 200 characters, with no Markdown.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from keras_gpu_tools.input.breakdown_advice import LABELS
from keras_gpu_tools.runtime.units import format_ms, format_percent

if TYPE_CHECKING:
    from keras_gpu_tools.input.breakdown_advice import FitBreakdown
    from keras_gpu_tools.input.measure import Measurement
    from keras_gpu_tools.input.stragglers import JobVerdict
    from keras_gpu_tools.input.verdict import Verdict


def verdict_line(who: str, v: Verdict, m: Measurement | None = None) -> str:
    """``who``'s verdict in one sentence: the category, the wait share and its span (``m``: the wait and step times)."""
    if v.wait_fraction is None:
        return f"{who}: input-bound: unknown (no timed training step)."
    times = f", {format_ms(m.wait)} of a {format_ms(m.step)} step" if m is not None and m.step is not None else ""
    span = f" ({'steady state, ' if v.left_out else ''}{v.scope})" if v.scope else ""
    faster = (
        f"; without the wait at most {v.speedup_bound:.2f}x faster"
        if v.input_bound and v.speedup_bound is not None
        else ""
    )
    return f"{who}: {v.category}{span}: {format_percent(v.wait_fraction)} of the step time waiting for input{times}{faster}."


def epoch_lines(v: Verdict, m: Measurement, job: JobVerdict | None) -> list[str]:
    """An epoch's verdict (its scope names the epoch), and the job's where it names a straggler."""
    lines = [verdict_line("InputBoundDetector", v, m)]
    if job is not None and job.stragglers:
        lines.append(f"InputBoundDetector job: {job.message}")
    return lines


WIDEST = 200  # characters of a terminal line


def fit_lines(
    v: Verdict, m: Measurement | None, run_dir: str | None, log_dir: str | None, breakdown: FitBreakdown | None = None
) -> list[str]:
    """The end of a fit: the run's verdict, and where the details are (with a log directory, its run and the report).

    The step's largest part (``breakdown``) joins whichever line it leaves under ``WIDEST`` characters
    (neither: it is in ``summary()``).
    """
    where = "InputBoundDetector: details in detector.summary()"
    if run_dir is not None and log_dir is not None:  # the log directory once: a long path stays one line
        run = os.path.relpath(run_dir, log_dir).replace(os.sep, "/")
        where += f", TensorBoard (run {run}) and: keras-gpu-tools report {log_dir}"
    lines = [verdict_line("InputBoundDetector", v, m), where]
    if breakdown is not None and breakdown.largest is not None:
        clause = f"the step's largest part: {LABELS[breakdown.largest]}"
        for i, head in ((1, "InputBoundDetector: "), (0, "")):
            line = lines[i]
            new = head + clause + "; " + line[len(head) :] if i == 1 else line.rstrip(".") + f"; {clause}."
            if len(new) <= WIDEST:
                lines[i] = new
                break
    return lines
