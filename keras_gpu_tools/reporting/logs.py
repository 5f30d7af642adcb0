"""A log directory as the sections read it: its runs' values and the JSON records of its ``.../data`` tags.

`keras_gpu_tools.reporting.from_logdir` finds the runs of one training and reads them into a
`Logs`; each section then takes its tags from it. A run is the lowest process's (or the only
process's, or Keras's own): ``own``; another process's of a job, of which only its GPUs are read:
``other``; or the job-wide run process 0 writes: ``job``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.reader import RunValues
from keras_gpu_tools.logdir.series import Series
from keras_gpu_tools.reporting.model import ReportData

T = TypeVar("T")
OWN, OTHER, JOB = "own", "other", "job"
UNSUPPORTED_DATA = schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX  # the logger's {gpu label: {field: reason}}


@dataclasses.dataclass
class Run:
    name: str
    kind: str  # OWN, OTHER or JOB
    values: RunValues


@dataclasses.dataclass
class Logs:
    """The runs read, in order, and what their texts hold (`read_texts` fills ``prose`` and ``records``)."""

    process_of: dict[str, int]  # a process's run: its process index
    runs: list[Run] = dataclasses.field(default_factory=list)
    prose: dict[str, str] = dataclasses.field(default_factory=dict)  # the last text of each tag written for people
    # Every valid JSON record of each ``.../data`` tag, in the order written: (run, value).
    records: dict[str, list[tuple[str, Any]]] = dataclasses.field(default_factory=dict)

    def scalars(self, *kinds: str) -> Iterator[tuple[str, str, Series]]:
        """(run, tag, points) of every scalar tag of the runs of `kinds` (default: own and other), in order."""
        for run in self.runs:
            if run.kind in (kinds or (OWN, OTHER)):
                for tag, points in run.values.scalars.items():
                    yield run.name, tag, points

    def every(self, tag: str) -> list[tuple[str, Any]]:
        """Every record of `tag`, in the order written: (run, value)."""
        return self.records.get(tag, [])

    def convert(self, data: ReportData, tag: str, convert: Callable[[Any], T], every: bool = False) -> T | None:
        """`convert` of the last record of `tag` (`every`: of the list of its records); None where the tag is
        missing or its JSON not shaped as expected (noted)."""
        if tag not in self.records:
            return None
        try:
            return convert([v for _, v in self.records[tag]] if every else self.records[tag][-1][1])
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            data.notes.append(f"The JSON of tag {tag!r} is not as expected ({type(e).__name__}: {e}); it is left out.")
            return None

    def read_texts(self, data: ReportData) -> None:
        """The prose and the JSON records of the own runs and, of other processes, their GPUs' records."""
        texts: list[tuple[str, str, int, float, str]] = []
        for run in self.runs:
            if run.kind == JOB:
                continue
            for tag, events in run.values.texts.items():
                if run.kind == OWN or tag in (schema.GPU_DEVICES_DATA, UNSUPPORTED_DATA):
                    texts += [(run.name, tag, e.step, e.wall_time, e.text) for e in events]
        for run_name, tag, _step, _wall, text in sorted(texts, key=lambda t: (t[3], t[2])):
            if not tag.endswith(schema.DATA_SUFFIX):
                self.prose[tag] = text
                continue
            try:
                value = json.loads(text)
            except ValueError:
                data.notes.append(f"The tag {tag!r} of run {run_name!r} holds no valid JSON; it is left out.")
                continue
            self.records.setdefault(tag, []).append((run_name, value))
