"""The detector in a job of several processes: one exchange per epoch end, job-wide keys, the straggler verdict.

Every process sends its row (:func:`~keras_gpu_tools.input.stragglers.process_row`)
over the job's channel at the same point and gets the same list back, so all
of them compute the same keys and verdict. The first exchange of a fit also
compares the processes' per-device peaks: where they drive different GPUs,
MFU's denominator is their sum. Where a ``GPUUtilizationLogger`` runs in the
same fit, each row carries the process's GPU health of the epoch (read from
the source the logger publishes in the fit's session), so that the verdict
can say why a process is slow.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from keras_gpu_tools.errors import InputPipelineWarning
from keras_gpu_tools.input import stragglers
from keras_gpu_tools.input.categories import UNKNOWN
from keras_gpu_tools.input.health_cause import process_health
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Verdict
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter, to_plain
from keras_gpu_tools.runtime.topology import JobGather
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry.health_fields import SHARED_GPU_HEALTH, GPUHealthSource


@dataclasses.dataclass
class JobEpoch:
    """What one epoch end's exchange gave."""

    logs: dict[str, float]  # the job-wide keys, the same on every process
    verdict: stragglers.JobVerdict
    peak: float | None  # the summed peak of the step's devices over the job (first exchange of the fit)
    first: bool  # the fit's first exchange: ``peak`` is new


class JobExchange:
    """The detector's figures across a job: gathered once per epoch end, written by process 0."""

    def __init__(
        self,
        gather: JobGather,
        devices: int,
        job_writer: Callable[[], EventWriter | None],
        shared: Mapping[str, Any] | None = None,
    ):
        self.gather = gather
        self.devices = devices  # devices that run one step
        self.job_writer = job_writer  # the job run's writer (process 0), opened at its first figures
        self.shared = {} if shared is None else shared  # the fit session's: the logger's GPU health, if any
        self.peak_checked = False
        self._health_failed = False

    def health(self) -> dict[str, list[Any]] | None:
        """This process's GPU health of the epoch (None: no logger in the fit, or reading it failed)."""
        source: GPUHealthSource | None = self.shared.get(SHARED_GPU_HEALTH)
        if source is None or self._health_failed:
            return None
        try:
            return process_health(source.last_epoch())
        except Exception as e:  # the job's figures go on without it
            self._health_failed = True
            WarnOnce(InputPipelineWarning)(
                "health", f"InputBoundDetector: the GPU health is left out of the job's verdict for this fit(): {e!r}"
            )
            return None

    @property
    def active(self) -> bool:
        return self.gather.active

    def epoch(
        self,
        epoch: int,
        m: Measurement,
        steady: Measurement | None,
        v: Verdict | None,
        peak_device: float | None,
        step: int,
    ) -> JobEpoch | None:
        """Exchanges this epoch's figures ``m`` and the steady state's; None where the job's are not to be had."""
        if not self.gather.active:
            return None
        topology = self.gather.topology
        row = stragglers.process_row(
            topology.process_index,
            topology.host,
            m.logs(),
            steady.logs() if steady is not None else {},
            scope=v.scope if v is not None else "",
            category=v.category if v is not None else UNKNOWN,
            advice=v.advice if v is not None else (),
            peak_flops=None if self.peak_checked else peak_device,
            health=self.health(),
        )
        # Own row as the others see it (JSON), so every process computes from identical values.
        rows = self.gather.gather(f"epoch{epoch}", json.loads(json.dumps(to_plain(row))))
        if rows is None:
            return None
        first, self.peak_checked = not self.peak_checked, True
        out = JobEpoch(
            stragglers.job_logs(rows),
            stragglers.job_verdict(rows),
            stragglers.job_peak(rows, self.devices) if first else None,
            first,
        )
        writer = self.job_writer()
        if writer is not None:
            writer.scalars(out.logs, step=step)
            writer.text(schema.INPUT_JOB_VERDICT, out.verdict.text(), step=step)
        return out
