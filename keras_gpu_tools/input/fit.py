"""One fit()'s input analysis: windows into epochs, the steady state's verdict, FLOP rates, the job's figures.

Nothing here knows about Keras: the detector feeds it each closed window's
:class:`~keras_gpu_tools.input.timing.StepStats` and each epoch end, and reads
the verdicts and figures back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from keras_gpu_tools.input import stragglers
from keras_gpu_tools.input.job import JobExchange
from keras_gpu_tools.input.later import Later, LaterList
from keras_gpu_tools.input.measure import Measurement, Sums, aggregate
from keras_gpu_tools.input.span import steps_label
from keras_gpu_tools.input.steady import FitSpans
from keras_gpu_tools.input.timing import StepStats
from keras_gpu_tools.input.verdict import Judge, Verdict
from keras_gpu_tools.runtime.topology import JobGather


@dataclasses.dataclass
class EpochEnd:
    """What an epoch end gave: the epoch's figures and verdict, and its logged keys (job-wide ones included).

    The verdict is made when first read (the TensorBoard writer reads it off the training thread).
    """

    measurement: Measurement
    later: Later[Verdict]
    logs: dict[str, float]

    @property
    def verdict(self) -> Verdict:
        return self.later()


def _without_advice(v: Verdict) -> Verdict:
    """A window's verdict: its figures and evidence, no advice (that is the epochs' and the run's)."""
    v.advice = []
    return v


class FitViews:
    """The last fit's analysis (``self._fit``, an :class:`InputFit`) as attributes of the detector."""

    _fit: InputFit

    @property
    def verdict(self) -> Verdict | None:
        """The run's verdict: its steady state (None before a fit)."""
        return self._fit.verdict

    @verdict.setter
    def verdict(self, value: Verdict | None) -> None:
        self._fit.verdict = value

    @property
    def measurement(self) -> Measurement | None:
        """The steady state's figures (the verdict's scope)."""
        return self._fit.measurement

    @measurement.setter
    def measurement(self, value: Measurement | None) -> None:
        self._fit.measurement = value

    @property
    def fit_measurement(self) -> Measurement | None:
        """The whole fit's figures, every phase in."""
        return self._fit.fit_measurement

    @fit_measurement.setter
    def fit_measurement(self, value: Measurement | None) -> None:
        self._fit.fit_measurement = value

    @property
    def job_verdict(self) -> stragglers.JobVerdict | None:
        """The job's verdict (a job of several processes)."""
        return self._fit.job_verdict

    @job_verdict.setter
    def job_verdict(self, value: stragglers.JobVerdict | None) -> None:
        self._fit.job_verdict = value

    @property
    def epoch_verdicts(self) -> list[Verdict]:
        """Each epoch's verdict."""
        return self._fit.epoch_verdicts

    @epoch_verdicts.setter
    def epoch_verdicts(self, value: list[Verdict]) -> None:
        self._fit.epoch_verdicts = value

    @property
    def window_verdicts(self) -> list[tuple[int, Verdict]]:
        """(global step, verdict) of each window."""
        return self._fit.window_verdicts

    @window_verdicts.setter
    def window_verdicts(self, value: list[tuple[int, Verdict]]) -> None:
        self._fit.window_verdicts = value


class InputFit:
    """The analysis of one fit(): only windows are measured; epochs, the steady state and the fit are their sums.

    ``peak_device`` is one device's peak FLOP/s; MFU divides by it times
    ``devices`` (the devices that run one step) until the job's first exchange
    says that its processes drive different GPUs (then by the sum of theirs).
    ``job_failed(gather, error)`` is called where the job's figures fail.
    """

    def __init__(
        self,
        judge: Judge | None = None,
        flops: float | None = None,
        peak_device: float | None = None,
        devices: int = 1,
        exchange: JobExchange | None = None,
        job_failed: Callable[[JobGather, Exception], None] | None = None,
    ):
        self._judge = judge  # None only in the placeholder before a fit
        self.flops = flops  # of one (global) step
        self.peak_device = peak_device
        self.devices = devices
        self.peak = peak_device * devices if peak_device else None  # the summed peak of the step's devices
        self.exchange = exchange
        self.job_failed = job_failed
        self.spans = FitSpans()
        self._verdict: Verdict | None = None
        self._measurement: Measurement | None = None  # the steady state's figures (the verdict's scope)
        self._fit_measurement: Measurement | None = None  # the whole fit's, every phase included
        self._stale = False  # an epoch ended since they were made: made again when next read
        self._made = 0  # the verdicts' generation: each epoch end and the final verdict add one
        self._lock = threading.Lock()  # the generation and the verdicts' assignment (read from two threads)
        self.job_verdict: stragglers.JobVerdict | None = None
        # Made when read (``input/later.py``): an epoch end keeps what each verdict is made of.
        self._epoch_verdicts: LaterList[Verdict] = LaterList()
        self._window_verdicts: LaterList[tuple[int, Verdict]] = LaterList()  # (global step, verdict)

    @property
    def epoch_verdicts(self) -> list[Verdict]:
        """Each epoch's verdict."""
        return self._epoch_verdicts.items()

    @epoch_verdicts.setter
    def epoch_verdicts(self, value: list[Verdict]) -> None:
        self._epoch_verdicts = LaterList(value)

    @property
    def window_verdicts(self) -> list[tuple[int, Verdict]]:
        """(global step, verdict) of each window."""
        return self._window_verdicts.items()

    @window_verdicts.setter
    def window_verdicts(self, value: list[tuple[int, Verdict]]) -> None:
        self._window_verdicts = LaterList(value)

    @property
    def judge(self) -> Judge:
        """This fit's judge; the placeholder made before any fit has none."""
        if self._judge is None:
            raise AttributeError("InputFit: no judge before a fit has started")
        return self._judge

    def _fresh(self) -> None:
        """Makes the verdict and its figures again where an epoch ended since they were made."""
        if self._stale:
            self._refresh()

    @property
    def verdict(self) -> Verdict | None:
        """The run's verdict: its steady state (None before an epoch ends)."""
        self._fresh()
        return self._verdict

    @verdict.setter
    def verdict(self, value: Verdict | None) -> None:
        self._fresh()
        self._verdict = value

    @property
    def measurement(self) -> Measurement | None:
        """The steady state's figures (the verdict's scope)."""
        self._fresh()
        return self._measurement

    @measurement.setter
    def measurement(self, value: Measurement | None) -> None:
        self._fresh()
        self._measurement = value

    @property
    def fit_measurement(self) -> Measurement | None:
        """The whole fit's figures, every phase included."""
        self._fresh()
        return self._fit_measurement

    @fit_measurement.setter
    def fit_measurement(self, value: Measurement | None) -> None:
        self._fresh()
        self._fit_measurement = value

    def _refresh(self) -> None:
        """Makes the verdict again when read, from any thread (LiveView draws on the fit session's).

        Made outside the lock and kept only if no epoch ended and no final
        verdict was made meanwhile: a verdict of older figures never replaces a newer one.
        """
        made = self._made
        s = self.spans.steady_state(self.figures, self.judge.pipeline, False)
        v = None if s is None else self._steady_verdict(s)
        with self._lock:
            if made != self._made or not self._stale:
                return
            self._stale = False
            if s is not None:
                self._measurement, self._fit_measurement, self._verdict = s.measurement, s.fit, v

    def steady_epochs(self) -> list[bool] | None:
        """Per epoch, whether the verdict counts it (its scope); None where its phases are not epochs."""
        v = self.verdict
        if v is None or not v.phases or not all(p.label.startswith("epoch") for p in v.phases):
            return None
        return [p.steady for p in v.phases]

    def figures(self, sums: Sums) -> Measurement:
        """A span's figures from its running sums, with this fit's FLOP rates."""
        return sums.measurement(self.flops, self.peak, self.devices)

    def aggregate(self, parts: Sequence[Measurement]) -> Measurement:
        return aggregate(parts, self.flops, self.peak, self.devices)

    def close_window(self, stats: StepStats, t0: float, step: int) -> Measurement | None:
        """Adds the window of ``stats`` that ends at global ``step``; its figures where they make a verdict."""
        m = stats.measurement(self.flops, self.peak, self.devices)
        label = steps_label(step - stats.steps + 1, step)
        self.spans.add_window(label, m, t0)
        if m.wait_fraction is None and m.steps_per_sec is None:
            return None
        v = self.judge.later(m, t0, scope=label, with_advice=False)
        self._window_verdicts.add(lambda: (step, _without_advice(v())))
        return m

    def end_epoch(self, epoch: int, t0: float, step: int) -> EpochEnd:
        """Closes epoch ``epoch`` (0-based, begun at wall time ``t0``) of the windows so far."""
        scope = f"epoch {epoch + 1}"
        m = self.spans.end_epoch(scope, t0, self.aggregate)
        # From this fit's second epoch on, a cache is filled (with `initial_epoch`, Keras's index is no guide).
        v = self.judge.later(m, t0, scope=scope, cache_serves=len(self.spans.epochs) > 1)
        self._epoch_verdicts.add(v)
        self.update()
        job = None
        if self.exchange is not None:
            try:  # once per epoch, every process at the same point
                steady, brief = self._steady_brief()
                job = self.exchange.epoch(epoch, m, steady, brief, self.peak_device, step)
            except Exception as e:  # another process's row of another shape: the job's figures, never the training
                if self.job_failed is not None:
                    self.job_failed(self.exchange.gather, e)
        if job is None:
            return EpochEnd(m, v, m.logs())
        self.job_verdict = job.verdict
        if job.first and job.peak != self.peak:  # MFU against the job's summed peak
            self.peak = job.peak
            m = self.spans.remeasure_last_epoch(self.aggregate)
            self.update()
        return EpochEnd(m, v, dict(m.logs(), **job.logs))

    def update(self, final: bool = False) -> None:
        """The run's verdict: its steady state, the phases left out, the whole fit's figures.

        After an epoch the verdict is made when first read (it lists every
        epoch, so making it at each epoch end would cost more each epoch);
        ``final`` (fit() ended, perhaps inside an epoch: its windows so far
        count) makes it now.
        """
        with self._lock:
            self._made += 1
            self._stale = not final
        if final:
            self._judge_steady_state(final=True)

    def _steady_brief(self) -> tuple[Measurement | None, Verdict | None]:
        """The steady state's figures and its verdict without the phases or the GPU's figures: what the job's row needs.

        The row sends the scope, category and advice, none of which depends on
        the phases (a list of every epoch) or on the GPU logger's points since
        the steady state began: leaving them out keeps each epoch end of a job
        as cheap at epoch 3,000 as at epoch 10. The verdict itself is still made
        in full when first read.
        """
        if not self._stale:
            return self._measurement, self._verdict
        s = self.spans.steady_state(self.figures, self.judge.pipeline, with_phases=False)
        if s is None:
            return None, None
        brief = self.judge(
            s.measurement, s.since, scope=s.scope, fit=s.fit, cache_serves=s.cache_serves, quote_gpu=False
        )
        return s.measurement, brief

    def _judge_steady_state(self, final: bool) -> None:
        s = self.spans.steady_state(self.figures, self.judge.pipeline, final)
        if s is not None:
            self._measurement, self._fit_measurement = s.measurement, s.fit
            self._verdict = self._steady_verdict(s)

    def _steady_verdict(self, s) -> Verdict:
        return self.judge(
            s.measurement, s.since, scope=s.scope, phases=s.phases, fit=s.fit, cache_serves=s.cache_serves
        )
