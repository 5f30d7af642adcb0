"""What every callback of the package shares: the fit session, one locked teardown, the run directory.

A subclass implements :meth:`FitCallback._start_fit` (what ``on_train_begin`` did) and
:meth:`FitCallback._stop_fit` (releasing all it started). The base class guarantees, for every fit()
(docs/debugging.md tells how):

- the Keras version is checked (a warning once when outside the tested range);
- what an earlier fit() that died left behind is released first;
- ``_start_fit`` runs inside a try: if it raises, ``_stop_fit`` runs at once and nothing stays attached;
- ``_stop_fit`` runs exactly once per fit, under one lock, whether fit() returned (``on_train_end``),
  raised (the shared :class:`~keras_gpu_tools.runtime.session.FitSession` notices), or the user calls
  ``close()``; with ``_stop_on_training_thread`` it is deferred to the training thread when the session
  notices from its watchdog;
- epoch figures go into Keras's logs through ``_epoch_figures`` and lines to
  the terminal through ``_print``: the fit's
  :class:`~keras_gpu_tools.runtime.fit_output.FitOutput` keeps them off the
  progress bar's line and out of Keras's TensorBoard callback;
- every key a callback will log in this fit (``_planned_epoch_keys`` at its
  start, and any logged since) is in every epoch's logs, NaN until measured:
  History's lists stay as long as the epochs and CSVLogger, whose columns are
  those of the first epoch, writes every key.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import threading
from typing import Any

import keras

from keras_gpu_tools import backends
from keras_gpu_tools.callbacks._lean import LeanCallback
from keras_gpu_tools.logdir import claim as logdir_claim
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import topology as topo
from keras_gpu_tools.runtime.fit_output import FitOutput, check_progress_bar, wrap
from keras_gpu_tools.runtime.job_channel import JobChannel
from keras_gpu_tools.runtime.session import FitSession, run_deferred
from keras_gpu_tools.runtime.step_hook import StepHook
from keras_gpu_tools.runtime.ticker import Job
from keras_gpu_tools.runtime.typing_compat import override

# fit() starts per run name in this process. Every process of a job counts
# alike, so ``<run name>/fit<n>`` names the same fit() everywhere, also when a
# new callback is made for each fit() (the job's store refuses a key twice).
_FIT_SERIAL: collections.Counter = collections.Counter()

WRITE_LATER_S = 0.5  # how often the session's thread writes the events a callback handed over


class FitCallback(LeanCallback):
    """Base class of the package's callbacks that run during fit() (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._teardown_lock = threading.RLock()
        self._stopping = False  # its fit's teardown runs: the fit counts as running until it is done
        self._session: FitSession | None = None
        self._backend_obj: backends.Backend | None = None
        self._global_step = 0  # training steps seen by this instance, across fit() calls
        self._fit_serial = 0  # this fit()'s number among the process's fits with this run name
        self.topology = topo.Topology()  # this process's place in the job, read at each fit()
        self._job_left_out: str | None = None  # why this fit's job-wide figures are left out from its start

    #: Whether every process of a job must run this callback (it agrees with the others on what each step does).
    _needs_every_process = False
    #: How long an epoch end waits for the other processes of a job (once for all callbacks; a dead one ends it).
    job_timeout_s: float = 60.0
    #: Of the callbacks' brief fields, the one of the lowest priority is shown (one field of ours at most).
    _bar_priority = 0
    _progress_bar = "none"  # the bar stays as wide as plain Keras makes it
    _output: FitOutput | None = None  # the running (or last) fit's

    @property
    def progress_bar(self) -> str:
        """Which of this callback's epoch figures Keras's progress bar shows: "brief", "all" or "none"."""
        return self._progress_bar

    @progress_bar.setter
    def progress_bar(self, value: str) -> None:
        self._progress_bar = check_progress_bar(value)

    _epoch_keys: frozenset[str] = frozenset()  # this fit's keys in the epoch logs (NaN where not measured)
    _brief: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("on_epoch_end")
        if own is not None:  # every epoch end of ours fills the fit's keys, however it returns

            @functools.wraps(own)
            def on_epoch_end(self: FitCallback, epoch: int, logs: dict | None = None) -> None:
                try:
                    own(self, epoch, logs)
                finally:
                    self._fill_epoch_logs(logs)

            cls.on_epoch_end = on_epoch_end

    def _planned_epoch_keys(self) -> set[str]:
        """The keys this fit will log into the epoch logs, read when it starts (its devices and settings)."""
        return set()

    def _epoch_figures(self, values: dict[str, float], logs: dict | None, brief: str | None = None) -> None:
        """The epoch's figures into Keras's ``logs``; ``on_epoch_end``'s wrapper then fills the fit's other keys, once."""
        if logs is None:
            return
        logs.update(values)
        if not self._epoch_keys.issuperset(values):
            self._epoch_keys = self._epoch_keys | frozenset(values)
        self._brief = brief if brief is not None else self._brief

    def _fill_epoch_logs(self, logs: dict | None) -> None:
        """NaN ("not yet measured") for this fit's keys the epoch has no figure of; the bar told what changed."""
        if logs is None or not self._epoch_keys:
            return
        for key in self._epoch_keys:
            logs.setdefault(key, math.nan)
        told = (self._output, self._epoch_keys, self.progress_bar, self._brief)
        if self._output is not None and told != self._told:  # (the same objects: equal at once)
            self._output.figures(self._epoch_keys, self.progress_bar, self._brief, self._bar_priority)
            self._told = told

    _told: tuple[Any, ...] = ()  # what the fit's output was last told (``_fill_epoch_logs``)

    def _print(self, *lines: str) -> None:
        """Prints ``lines`` under the epoch's progress bar line, never inside it (at once outside a fit)."""
        for line in map(wrap, lines):
            if self._output is not None:
                self._output.say(line)
            else:
                print(line, flush=True)

    # -- for subclasses ---------------------------------------------------------------------
    def _start_fit(self, session: FitSession) -> None:
        """Starts what this fit() needs (threads, writers, the step hook: attach it last)."""

    def _stop_fit(self, aborted: bool) -> None:
        """Releases everything ``_start_fit`` started; ``aborted`` when fit() raised."""

    def _stop_on_training_thread(self) -> bool:
        """Whether ``_stop_fit`` must run on the training thread (torch's profiler)."""
        return False

    @property
    def backend(self) -> backends.Backend:
        """The Keras backend in use, as the package's backend object."""
        if self._backend_obj is None:
            self._backend_obj = backends.get(keras.backend.backend())
        return self._backend_obj

    @property
    def run_dir(self) -> str | None:
        """This callback's own TensorBoard run (None without a log_dir).

        ``log_dir/run_name``; in a job of several processes each writes its own
        run, ``log_dir/run_name/process_<i>``, so no run has two writers.
        """
        log_dir = getattr(self, "log_dir", None)
        return self.topology.run_dir(log_dir, self.run_name) if log_dir else None

    @property
    def _required_run_dir(self) -> str:
        """``run_dir`` of a callback whose ``log_dir`` is required (a non-empty path, checked when it was made)."""
        return self.topology.run_dir(self.log_dir, self.run_name)

    @property
    def job_run_dir(self) -> str | None:
        """The run of the job-wide figures, written by process 0 of a job of several (else None)."""
        log_dir = getattr(self, "log_dir", None)
        if not log_dir or not self.topology.multi_process or not self.topology.is_chief:
            return None
        return self.topology.job_run_dir(log_dir, self.run_name)

    def _job_gather(self) -> topo.JobGather:
        """The job's channel for this fit(): keys of this callback and fit; on failure a warning, once."""
        name = type(self).__name__
        gather = topo.JobGather(
            self.topology,
            f"{self._serial_name()}/fit{self._fit_serial}",
            lambda message: self.warnings("job", f"{name}: {message}"),
            float(self.job_timeout_s),
        )
        if self._job_left_out is not None and gather.active:
            gather.failed = True
            self.warnings("job", f"{name}: job-wide figures are left out for this fit(): {self._job_left_out}")
        return gather

    def _job_role(self) -> tuple[str, str, bool]:
        """What the processes of a job compare at fit start: (class name, run name, needs every process)."""
        return type(self).__name__, self._serial_name(), self._needs_every_process

    def _join_job(self, session: FitSession) -> None:
        """Joins the fit's job channel: the processes compare their callbacks (refusing what cannot run)."""
        self._job_left_out = None
        channel = JobChannel.of(session, self.topology.exchange) if self.topology.multi_process else None
        if channel is None:
            return
        siblings = [c for c in ki.find_callback_list(self.model) if isinstance(c, FitCallback)]
        channel.compare(siblings if self in siblings else [*siblings, self])
        self.topology = dataclasses.replace(self.topology, exchange=channel)
        self._job_left_out = channel.check(self)  # raises where the job cannot run as configured

    def _job_failed(self, gather: topo.JobGather | None, error: Exception) -> None:
        """This process's job figures failed: the job's are left out for the rest of the fit, the others told."""
        if gather is not None:
            gather.give_up(f"process {self.topology.process_index}'s figures failed ({type(error).__name__}: {error})")
        self.warnings(
            "job", f"{type(self).__name__}: job-wide figures are left out for the rest of this fit(): {error}"
        )

    # -- event files: this process's run, and the job's run (process 0 of a job) ---------------
    _writer: EventWriter | None = None
    _job_writer: EventWriter | None = None
    _job_writer_dir: str | None = None
    _write_job: Job | None = None

    def _open_writers(self, job: bool, session: FitSession | None = None) -> None:
        """This fit's writer of its own run (None without a log_dir); ``job``: the job's run, opened at its first figures.

        With ``session``, what is handed over to the writer (``EventWriter.later``) is written by the session's
        thread every ``WRITE_LATER_S``, and the rest at its close: nothing handed over is lost however fit() ends.
        """
        run_dir = self.run_dir  # None without a log_dir
        self._writer = EventWriter(run_dir) if run_dir is not None else None
        self._job_writer = None
        self._job_writer_dir = self.job_run_dir if job else None
        if session is not None and self._writer is not None:
            self._write_job = session.every(WRITE_LATER_S, self._writer.write_later, self._write_failed)

    def _write_failed(self, error: BaseException) -> None:
        self.warnings(
            "write", f"{type(self).__name__}: writing its TensorBoard run failed ({error!r}); training goes on."
        )

    def _job_events(self) -> EventWriter | None:
        """The job run's writer (process 0 of a job; else None), opened on first use."""
        if self._job_writer is None and self._job_writer_dir:
            self._job_writer = EventWriter(self._job_writer_dir)
        return self._job_writer

    def _close_writers(self) -> None:
        job, self._write_job = self._write_job, None
        if job is not None:
            job.stop()  # (a write under way finishes first; close() writes the rest)
        for name in ("_writer", "_job_writer"):
            writer = getattr(self, name)
            setattr(self, name, None)
            if writer is not None:
                writer.close()

    def _serial_name(self) -> str:
        return getattr(self, "run_name", type(self).__name__)

    @property
    def global_step(self) -> int:
        """Training steps seen by this instance, counted across fit() calls from 0."""
        return self._global_step

    @property
    def fit_running(self) -> bool:
        """Whether a fit() with this callback is running (started and not yet stopped)."""
        return self._session is not None or self._stopping

    # -- Keras hooks ---------------------------------------------------------------------------
    @override
    def on_train_begin(self, logs: dict | None = None) -> None:
        ki.check_keras_version()
        self._end_fit(aborted=True)  # what a fit() that died before its session noticed left
        self._backend_obj = None
        _FIT_SERIAL[self._serial_name()] += 1
        self._fit_serial = _FIT_SERIAL[self._serial_name()]
        try:
            self.topology = self.backend.topology(self.model)
        except Exception as e:  # monitoring never stops training: one process it is
            ki.logger.warning("keras_gpu_tools: reading the distribution failed (%s); taken as one process", e)
            self.topology = topo.single()
        session = FitSession.current(self.model)
        with self._teardown_lock:
            self._session = session
        session.add(self, lambda aborted: self._end_fit(aborted, session), self._stop_on_training_thread)
        try:
            self._output = FitOutput.of(session, ki.find_callback_list(self.model))
            self._join_job(session)
            self._claim_log_dir()
            self._epoch_keys, self._brief = frozenset(), None
            self._start_fit(session)
            if getattr(self, "epoch_logs", True):
                self._epoch_keys = frozenset(self._planned_epoch_keys())
        except BaseException:
            try:
                self._end_fit(aborted=True, session=session)
            finally:
                StepHook.detach_observer(self.model, self)  # attached before what failed
            raise

    @override
    def on_train_end(self, logs: dict | None = None) -> None:
        self._end_fit(aborted=False)

    def close(self) -> None:
        """Releases whatever a fit() with this callback still holds; safe to call twice.

        Everything is released automatically when fit() ends, also when it
        raises; this is for a fit() that died in a way nothing could notice.
        """
        run_deferred()
        self._end_fit(aborted=True)

    # -- internals -----------------------------------------------------------------------------
    _claimed: str | None = None  # the log directory this fit claimed (logdir/claim.py)

    def _claim_log_dir(self) -> None:
        """Whether another training writes our log directory now: then this fit's runs are its own, one level down."""
        log_dir = getattr(self, "log_dir", None)
        if not log_dir or self.topology.multi_process:  # a job's processes have runs of their own already
            return
        self._claimed = str(log_dir)
        self.topology = dataclasses.replace(self.topology, training=logdir_claim.claim(self._claimed))

    def _release_log_dir(self) -> None:
        claimed, self._claimed = self._claimed, None
        if claimed is not None:
            logdir_claim.release(claimed)

    def _end_fit(self, aborted: bool, session: FitSession | None = None) -> None:
        """Runs ``_stop_fit`` once for the fit of ``session`` (None: whichever is running)."""
        current = None
        try:
            with self._teardown_lock:
                if self._session is None or (session is not None and self._session is not session):
                    return  # that fit has already been stopped
                current, self._session = self._session, None
                self._stopping = True
                try:
                    self._stop_fit(aborted)
                finally:
                    self._stopping = False
                    self._release_log_dir()
        finally:
            if current is not None:
                # Outside the lock: the last release closes the session and waits for its thread,
                # which may itself be waiting for this lock (the watchdog aborting the same fit).
                current.release(self)
