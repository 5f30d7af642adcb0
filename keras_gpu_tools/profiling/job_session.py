"""A job's profiler sessions: every process's trace of a window in one session of the job's run.

The processes agree on the sessions' name at the start of each fit()
(process 0's clock), move their trace into the window's session
(:func:`~keras_gpu_tools.profiling.trace.move_to_job_session`) and meet once
at the end of each window, where process 0 learns every process's files and
mean step time.
"""

from __future__ import annotations

import os

from keras_gpu_tools.profiling import trace as prof
from keras_gpu_tools.profiling.capture import WindowCapture
from keras_gpu_tools.runtime.topology import JobGather


class JobSessions:
    """One fit()'s sessions in the job's run ``job_run_dir`` (named ``<prefix>_<window label>``)."""

    def __init__(self, gather: JobGather, job_run_dir: str, prefix: str):
        self.gather, self.job_run_dir, self.prefix = gather, job_run_dir, prefix

    @classmethod
    def join(cls, gather: JobGather, job_run_dir: str, fit_serial: int) -> JobSessions | None:
        """Agrees on the sessions' name with the other processes; None without a channel (each keeps its own)."""
        stamps = gather.gather("session", prof.session_stamp())
        if stamps is None:
            return None
        # Process 0's clock, to the second; a later fit() of this process in the same
        # second gets its own session (moving a trace would replace the first's).
        serial = f"_{fit_serial}" if fit_serial > 1 else ""
        if gather.topology.is_chief:
            os.makedirs(job_run_dir, exist_ok=True)
        return cls(gather, job_run_dir, f"{stamps[0]}{serial}")

    @property
    def active(self) -> bool:
        return self.gather.active

    def session(self, label: str) -> str:
        """The folder of a window's session (``label``: ``steps_<first>_<last>``)."""
        return os.path.join(self.job_run_dir, "plugins", "profile", f"{self.prefix}_{label}")

    def move_in(self, staging: str, pattern: str, label: str) -> list[str]:
        """Moves what this process's profiler just wrote under ``staging`` into the window's session."""
        index = self.gather.topology.process_index
        return prof.move_to_job_session(staging, set(), pattern, self.session(label), index)

    def meet(self, window: prof.Window, capture: WindowCapture, session: str) -> bool:
        """Once per window: every process has moved its trace in; on process 0 the job's figures go into ``capture``.

        The processes send the names of their files (not paths: hosts may
        mount ``log_dir`` elsewhere) and their mean step time. Whether this is
        process 0 and has the job's figures.
        """
        mine = {"files": [os.path.basename(f) for f in capture.files], "mean_step_ms": capture.mean_step_ms}
        everyone = self.gather.gather(f"window{window.start}", mine)
        if everyone is None or not self.gather.topology.is_chief:
            return False
        paths = [os.path.join(session, n) for p in everyone for n in p.get("files", [])]
        capture.job_files = [f for f in paths if os.path.exists(f)]  # missing: log_dir not shared by the hosts
        capture.job_mean_step_ms = [p.get("mean_step_ms") for p in everyone]
        return True
