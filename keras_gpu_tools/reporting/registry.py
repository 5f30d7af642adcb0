"""The report's sections, in the report's order: the one list the page, the gatherers and `report()` read.

A new section is a module of `keras_gpu_tools.reporting.sections` with a `Section`
(`keras_gpu_tools.reporting.section`) and one line here.
"""

from __future__ import annotations

from keras_gpu_tools.reporting.section import Section
from keras_gpu_tools.reporting.sections import (
    breakdown,
    gpu_health,
    gpus,
    input_pipeline,
    job,
    layer_table,
    memory,
    mixed_precision,
    oom,
    plan,
    profiler,
    speedups,
    step_time,
    training,
    unreadable,
)

SECTIONS: list[Section] = [
    unreadable.SECTION,
    gpus.SECTION,
    gpu_health.SECTION,
    job.SECTION,
    step_time.SECTION,
    input_pipeline.SECTION,
    breakdown.SECTION,
    plan.SECTION,
    speedups.SECTION,
    oom.SECTION,
    memory.SECTION,
    profiler.SECTION,
    layer_table.SECTION,
    mixed_precision.SECTION,
    training.SECTION,
]
