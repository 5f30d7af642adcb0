"""The public report: `report()` gathers a run into a `TrainingReport`, which renders it.

`report()` reads the callbacks given (`from_callbacks`), a log directory (`from_logdir`), or both
(the callbacks' records first, the log directory filling what they lack: `Section.fill`).
`TrainingReport` holds the `ReportData` and renders it as text (`text`), as HTML (`html`) and as
plots (`figures`), each drawn once.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import figures as plots
from keras_gpu_tools.reporting import html as html_page
from keras_gpu_tools.reporting import registry
from keras_gpu_tools.reporting import text as text_page
from keras_gpu_tools.reporting.from_callbacks import flatten, gather
from keras_gpu_tools.reporting.from_logdir import gather_log_dir
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.sections.mixed_precision import findings_markdown

_NO_MATPLOTLIB = "The plots need matplotlib, which could not be imported: `pip install matplotlib`."


class TrainingReport:
    """One view of a training run; see `report()`.

    Renders as text (`str(report)`, `report.text()`), as HTML in a notebook,
    and saves as an HTML file with its plots embedded (`report.save(path)`)
    or as PNG files (`report.save_figures(directory)`).
    """

    def __init__(self, data: ReportData):
        self.data = data
        self._figures: dict[str, Any] | None = None
        self._pngs: dict[str, bytes] | None = None

    # -- figures ------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        """The report's plots as matplotlib `Figure`s, by name (drawn once)."""
        if self._figures is None:
            if plots.available():
                self._figures = plots.draw(self.data)
            else:
                if _NO_MATPLOTLIB not in self.data.notes:
                    self.data.notes.append(_NO_MATPLOTLIB)
                self._figures = {}
        return self._figures

    def pngs(self) -> dict[str, bytes]:
        """The report's plots as PNG files' bytes, by name (drawn once)."""
        if self._pngs is None:
            self._pngs = {name: plots.png(fig) for name, fig in self.figures().items()}
        return self._pngs

    def save_figures(self, directory: str | os.PathLike[str]) -> list[str]:
        """Writes each plot as `<directory>/<name>.png`; returns the paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, data in self.pngs().items():
            path = os.path.join(directory, f"{name}.png")
            write_whole(path, data)
            paths.append(path)
        return paths

    # -- text and HTML ----------------------------------------------------------------
    def text(self) -> str:
        return text_page.render(self.data)

    __str__ = text

    def __repr__(self) -> str:
        return f"<TrainingReport {self.data.title!r}: {', '.join(self.figures()) or 'no plots'}>"

    def not_measured(self) -> list[str]:
        """What this run's report has no data for, and which callback measures it."""
        return text_page.not_measured(self.data)

    def html(self, full_page: bool = False) -> str:
        return html_page.render(self.data, self.pngs(), full_page=full_page)

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path: str | os.PathLike[str]) -> str:
        """Writes the report as one HTML file with the plots embedded; returns the path.

        The page is rendered first, then replaces `path` whole (`write_whole`): a failure leaves an
        earlier file as it was.
        """
        path = os.fspath(path)
        # Names decoded from bytes that are not UTF-8 hold lone surrogates: written as escapes.
        page = self.html(full_page=True).encode("utf-8", "backslashreplace")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_whole(path, page)
        return path

    def write_to_tensorboard(self, log_dir: str | os.PathLike[str], run_name: str = "report") -> str:
        """Writes the mixed-precision findings (text and JSON) and the text report into `log_dir/<run_name>`.

        The callbacks write everything else themselves; this keeps the
        findings for a report built later from the log directory, and puts
        the text report in TensorBoard's Text tab.
        """
        from keras_gpu_tools.logdir.writer import EventWriter

        run_dir = os.path.join(os.fspath(log_dir), run_name)
        writer = EventWriter(run_dir)
        try:
            if self.data.findings is not None:
                writer.text(schema.MIXED_PRECISION_FINDINGS, findings_markdown(self.data.findings), step=0)
                writer.json(schema.MIXED_PRECISION_FINDINGS_DATA, self.data.findings, step=0)
            writer.text(schema.REPORT_SUMMARY, "```\n" + self.text() + "\n```", step=0)
        finally:
            writer.close()
        return run_dir


def write_whole(path: str, data: bytes) -> None:
    """Writes `path` atomically: a temporary file next to it, then renamed over it.

    A failure (a full disk, an interrupt) leaves the earlier file as it was, never a part of the
    new one; the temporary file is removed.
    """
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)  # umask applies
    try:
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before it replaces the earlier file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def report(
    *sources: Any, log_dir: Any | None = None, title: str | None = None, layout: str = "latest"
) -> TrainingReport:
    """Combines what the callbacks measured into one report.

    Pass the callbacks of a `fit()` (any of the package's callbacks, in any
    order, or the list you gave to `fit()`), the `History` or the model
    (whose mixed-precision setup is then checked), the `BatchPlan` of
    `plan_batch_size` (or its `log_dir=`), the `SpeedupReport` of
    `find_speedups` (or its `log_dir=`), or a TensorBoard log
    directory to build the report after the fact from what the callbacks
    wrote there. With both, the callbacks' own records are used and the log
    directory fills in what they lack (Keras's training curves, for
    example).

    Args:
        *sources: callbacks, a `History`, a model, a `BatchPlan`, a `SpeedupReport`, lists of
            these, or one log directory (a path).
        log_dir: a TensorBoard log directory to read. Defaults to `None`.
        title: the report's title. Defaults to `None` ("Training report").
        layout: which runs of a log directory reused by a single-process fit
            and a job of several processes the report covers (it never mixes
            them): `"latest"` those written last, `"single"` the single
            process's (runs `gpu`, `input`, ...), `"job"` the job's
            (`gpu/process_<p>`, `gpu/job`, ...), or `"<host>_pid<pid>"`: a
            second training that wrote the directory at the same time
            (runs `<run>/<host>_pid<pid>`). The runs left out are named
            in a note. Defaults to `"latest"`.

    Returns:
        A `TrainingReport`: `str(r)` is the text, `r` displays as HTML with
        plots in a notebook, `r.save("report.html")` writes one HTML file
        with the plots embedded, `r.figures()` gives the matplotlib figures.
        Event files of `log_dir` that could not be read are listed in
        `r.data.unreadable` and named in the report.

    Raises:
        ValueError: nothing to report on, or `log_dir` does not exist, holds
            no event file, or none of its event files could be read.
        TypeError: a path among the sources next to other sources.

    Example:

    ```python
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, report

    callbacks = [GPUUtilizationLogger(log_dir="logs"), InputBoundDetector(log_dir="logs")]
    model.fit(dataset, epochs=3, callbacks=callbacks)
    r = report(callbacks, model)     # shows as HTML in a notebook
    print(r)                         # plain text in a terminal
    r.save("logs/report.html")
    report("logs").save("again.html")  # later, from the logs alone
    ```
    """
    objs = list(sources)
    if log_dir is None and len(objs) == 1 and isinstance(objs[0], (str, os.PathLike)):
        log_dir, objs = objs[0], []
    bad = [o for o in flatten(objs) if isinstance(o, (str, bytes, os.PathLike))]
    if bad:
        raise TypeError(
            f"Invalid value for argument `sources`. Received: {bad[0]!r} next to other sources. "
            "Expected callbacks, a History or a model; pass a log directory as `log_dir=`."
        )
    if objs:
        data = gather(objs, title)
        if log_dir is not None:
            _fill_from(data, gather_log_dir(os.fspath(log_dir), layout=layout))
    elif log_dir is not None:
        data = gather_log_dir(os.fspath(log_dir), title, layout)
    else:
        raise ValueError(
            "Invalid arguments: nothing to report on. Expected callbacks (or the list given to fit()), "
            "a History or a model, or `log_dir=` a TensorBoard log directory."
        )
    if title:
        data.title = title
    return TrainingReport(data)


def _fill_from(data: ReportData, other: ReportData) -> None:
    """Fills the parts `data` lacks from `other` (read from a log directory), section by section."""
    for section in registry.SECTIONS:
        section.fill(data, other)
    data.sources.append("log dir")
