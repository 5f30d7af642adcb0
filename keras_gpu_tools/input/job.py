"""The detector in a job of several processes: one exchange per epoch end, job-wide keys, the straggler verdict.

Every process sends its row (:func:`~keras_gpu_tools.input.stragglers.process_row`)
over the job's channel at the same point and gets the same list back, so all
of them compute the same keys and verdict. The first exchange of a fit also
compares the processes' per-device peaks: where they drive different GPUs,
MFU's denominator is their sum.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from keras_gpu_tools.input import stragglers
from keras_gpu_tools.input.categories import UNKNOWN
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Verdict
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter, to_plain
from keras_gpu_tools.runtime.topology import JobGather


@dataclasses.dataclass
class JobEpoch:
    """What one epoch end's exchange gave."""

    logs: dict[str, float]  # the job-wide keys, the same on every process
    verdict: stragglers.JobVerdict
    peak: float | None  # the summed peak of the step's devices over the job (first exchange of the fit)
    first: bool  # the fit's first exchange: ``peak`` is new


class JobExchange:
    """The detector's figures across a job: gathered once per epoch end, written by process 0."""

    def __init__(self, gather: JobGather, devices: int, job_writer: Callable[[], EventWriter | None]):
        self.gather = gather
        self.devices = devices  # devices that run one step
        self.job_writer = job_writer  # the job run's writer (process 0), opened at its first figures
        self.peak_checked = False

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
