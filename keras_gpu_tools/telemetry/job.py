"""The GPUs of a whole job: the spread of each GPU's epoch means over every GPU of the job.

One process over several GPUs (MirroredStrategy, DataParallel) is the whole
job: its own GPUs, nothing exchanged. One process, one GPU: no job figures.
In a job of several processes each sends its GPUs' figures once per epoch
over the job's channel; every process computes the same keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.topology import JobGather, Topology, spread

# The per-GPU epoch means whose spread over every GPU of a job is logged as `job/gpu/<metric>_min|_mean|_max`.
JOB_METRICS = ("utilization_percent", "sm_activity_percent", "memory_used_mib")


def job_gpu_figures(
    epoch: int, values: dict[str, float], labels: Sequence[str], topology: Topology, gather: JobGather | None
) -> dict[str, float]:
    """`job/gpu/<metric>_min|_mean|_max` over every GPU of the job from this process's epoch ``values``.

    Raises ``ValueError`` where a process sent figures of another shape.
    """
    single = not topology.multi_process
    if (single and len(labels) < 2) or (not single and (gather is None or not gather.active)):
        return {}  # one process of one GPU, or a job whose exchange is off: before any figure is read
    mine = {m: [values[k] for k in (schema.gpu_key(label, m) for label in labels) if k in values] for m in JOB_METRICS}
    everyone: list[Any] | None  # every process's figures: another version's may differ in shape
    if single:
        everyone = [mine]
    else:
        assert gather is not None  # (checked above)
        everyone = gather.gather(f"epoch{epoch}", mine)
        if everyone is None:
            return {}  # JobGather warned once and gave up for this fit
    out: dict[str, float] = {}
    try:
        for m in JOB_METRICS:
            figures = spread([v for theirs in everyone for v in theirs.get(m) or ()])
            for stat, value in (figures or {}).items():
                out[schema.job_gpu_key(m, stat)] = value
    except (AttributeError, TypeError, ValueError) as e:  # a process of another version of the package
        raise ValueError(f"a process sent figures of another shape ({e})") from None
    return out
