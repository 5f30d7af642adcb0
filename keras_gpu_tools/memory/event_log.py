"""The record of a reducer's out-of-memory events: counts, the log, TensorBoard and a file per event.

Each :class:`~keras_gpu_tools.memory.recovery.OOMEvent` is kept (``events``),
logged to the ``keras_gpu_tools`` logger (printed with ``verbose``), written to
the run's TensorBoard events (``oom/events_total``, ``oom/micro_batches``, the
event as JSON for the report, its explanation as text) and, with a log dir, to
files under ``<run>/oom_events``: the explanation as text and JSON, and the
files the backend made (a memory snapshot). Framework-free.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter, to_plain, writes_failed, writes_stopped
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.memory.explain import OOMExplanation, headroom_lines

logger = logging.getLogger("keras_gpu_tools")

_PREFIX = "OOMBatchSizeReducer: "


class EventLog:
    """Every out-of-memory event of a reducer, and where each one is written.

    Args:
        warn: ``warn(key, message)``, once per key (a folder that cannot be written).
        verbose: print each event too. Defaults to `0`.
        run_dir: returns the run's folder for the event files (None: no files).
            Defaults to none.
        say: prints a line (with ``verbose``). Defaults to `print`.
    """

    def __init__(
        self,
        warn: Callable[[str, str], None],
        verbose: int = 0,
        run_dir: Callable[[], str | None] = lambda: None,
        say: Callable[[str], None] = print,
    ):
        self.warn = warn
        self.verbose = verbose
        self.say = say
        self.run_dir = run_dir
        self.events: list[OOMEvent] = []
        self.recovery_seconds = 0.0  # in failed attempts
        self.epoch_events = 0
        self.noticed = False  # this fit's first recovery was said (without verbose, only the first is)
        self.writer: EventWriter | None = None  # the run's TensorBoard events, while a fit with a log dir runs

    def record(self, event: OOMEvent, artifacts: dict[str, bytes]) -> None:
        """Keeps, logs and writes ``event``; ``artifacts`` are the backend's files of its explanation."""
        self._write_files(event, artifacts)
        self.events.append(event)
        self.recovery_seconds += event.seconds
        self.epoch_events += 1
        line = _PREFIX + event.line()
        why = event.why()
        if why:
            line += "\n  " + "\n  ".join(why)
        logger.info(line)  # for a configured log; the terminal gets it from `say`, after the epoch's bar line
        if self.verbose:
            self.say(line)
        elif not self.noticed:  # quiet: one short line a fit, the details in summary(), TensorBoard, the report
            self.noticed = True
            self.say(f"{_PREFIX}recovered from an out-of-memory error at step {event.step}; summary() has each one.")
        if self.writer is not None:
            values = {schema.OOM_EVENTS_TOTAL: float(len(self.events))}
            if event.next_split is not None:
                values[schema.OOM_MICRO_BATCHES] = float(event.next_split)
            self.writer.scalars(values, step=event.step)
            self.writer.json(schema.OOM_EVENTS_DATA, event, step=event.step)  # for report()
            if why:
                self.writer.text(schema.OOM_EXPLANATION, event.line() + "\n\n" + "\n\n".join(why), step=event.step)

    def _write_files(self, event: OOMEvent, artifacts: dict[str, bytes]) -> None:
        """A file per event under ``run_dir/oom_events``: the explanation (text and JSON) and the backend's files."""
        run_dir = self.run_dir()
        if run_dir is None or event.explanation is None:
            return
        folder = os.path.join(run_dir, schema.OOM_EVENTS_DIR)
        if writes_stopped(run_dir):  # the run's disk is full: said once already
            return
        try:
            os.makedirs(folder, exist_ok=True)
            base = os.path.join(folder, f"{event.phase}_step{event.step}_{len(self.events)}")
            files = []
            for suffix, data in artifacts.items():
                with open(f"{base}_{suffix}", "wb") as f:
                    f.write(data)
                files.append(f"{base}_{suffix}")
            event.explanation["files"] = [f"{base}.txt", f"{base}.json"] + files
            event.explanation["lines"] = OOMExplanation.from_dict(event.explanation).lines()
            with open(f"{base}.txt", "w") as f:
                f.write(event.line() + "\n" + "\n".join(event.why()) + "\n")
            with open(f"{base}.json", "w") as f:
                json.dump(to_plain(event), f, indent=1)
        except OSError as e:  # one warning for the run, as its event files' writer gives
            writes_failed(run_dir, e)

    def end_epoch(self, micro_batches: int, step: int) -> dict[str, float]:
        """The epoch's figures, handed over to TensorBoard's writer and returned (for the epoch logs: History).

        The writer writes them later, off the training thread (``EventWriter.scalars_later``), with this call's time.
        """
        values = {schema.OOM_EVENTS: float(self.epoch_events), schema.OOM_MICRO_BATCHES: float(micro_batches)}
        if self.writer is not None:
            self.writer.scalars_later(dict(values), step=step)
        return values

    def close(self, headroom: list[dict[str, Any]], step: int) -> None:
        """The end of a fit: the headroom for the report, and the writer closed."""
        writer, self.writer = self.writer, None
        if writer is not None:
            if headroom:
                writer.json(schema.OOM_HEADROOM_DATA, headroom, step=step)  # for report()
            writer.close()

    def summary(self, headroom: list[dict[str, Any]], micro_batch_size: int | None) -> str:
        """One line per event (and why, where known), the headroom, and the split in use."""
        lines = [f"{_PREFIX}headroom: {h}" for h in headroom_lines(headroom)]
        if not self.events:
            return "\n".join([f"{_PREFIX}no out-of-memory error."] + lines)
        out = []
        for e in self.events:
            out.append(_PREFIX + e.line())
            out.extend(f"  {w}" for w in e.why())
        out += lines
        out.append(
            f"{_PREFIX}{len(self.events)} recovery(ies), {self.recovery_seconds:.2f} s in failed attempts; "
            f"micro-batches of {micro_batch_size if micro_batch_size else 'the whole batch'} now."
        )
        return "\n".join(out)


def unrecoverable_event(
    error: BaseException, signature, phase: str, step: int, kind: str | None, explanation: dict[str, Any] | None
) -> OOMEvent:
    """The event of an out-of-memory error that is not retried (at a batch shape that ran whole)."""
    batch_size = next((shape[0] for shape, _ in signature if shape), 0) if signature else 0
    return OOMEvent(
        step=step,
        batch_size=int(batch_size or 0),
        failed_split=1,
        next_split=None,
        kind=kind or "unknown",
        phase=phase,
        explanation=explanation,
    )


__all__ = ["EventLog", "unrecoverable_event"]
