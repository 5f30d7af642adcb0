"""Logs written before the JSON tags: their text, read as well as it can be.

Earlier versions of the callbacks wrote only the text meant for people (no ``.../data`` tag).
Where a log directory has no JSON for a part of the report, these parsers fill it from that text.
"""

from __future__ import annotations

import re
from typing import Any

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.reporting import rows
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.text import NO_FINDING

_SUMMARY_ROWS = {"steps/s": schema.STEPS_PER_SEC, "samples/s": schema.SAMPLES_PER_SEC}


def read_old_prose(
    data: ReportData, prose: dict[str, str], records: dict[str, Any], profiles: dict[str, dict[str, Any]]
) -> None:
    """Fills what no JSON tag gave from the texts written for people (logs of earlier versions).

    ``prose``: the last text of each tag; ``records``: the JSON tags read; ``profiles``: the
    profiler windows by tag (``profile/steps_<first>_<last>``), filled in place.
    """
    if schema.GPU_DEVICES_DATA not in records and schema.GPU_DEVICES in prose:
        data.gpus = parse_device_table(prose[schema.GPU_DEVICES])
    if schema.MIXED_PRECISION_FINDINGS_DATA not in records and schema.MIXED_PRECISION_FINDINGS in prose:
        text = prose[schema.MIXED_PRECISION_FINDINGS]
        data.findings = [] if text.strip().startswith(NO_FINDING) else parse_findings(text)
    if schema.INPUT_VERDICT_DATA not in records and schema.INPUT_VERDICT in prose:
        data.verdict = parse_verdict(prose[schema.INPUT_VERDICT])
        data.throughput.update(figures_of(prose[schema.INPUT_VERDICT]))
    for tag, text in prose.items():
        m = schema.PROFILE_WINDOW_TEXT_RE.match(tag)
        if m is None or m.group(1) + schema.DATA_SUFFIX in records:
            continue
        # Only logs of earlier versions come here (each window now has its JSON record), and their
        # names held the window's start and end counted from 0: steps_20_25 is steps 21-25.
        a, b = int(m.group(2)), int(m.group(3))
        p = profiles.setdefault(m.group(1), rows.profile_row({"start_step": a, "num_steps": b - a}))
        if m.group(4):
            p["conclusion"] = text
            continue
        line = parse_window_line(text)
        if line is not None:
            p["reason"], p["trace_dir"], p["size_mib"], p["mean_step_ms"] = line


def parse_verdict(text: str) -> dict[str, Any]:
    """The report's verdict from an `InputBoundDetector` summary."""
    lines = text.splitlines()
    first = lines[0] if lines else ""
    head = first.split(":", 1)[1].strip() if ":" in first else "unknown"
    # "moderately input-bound (epochs 2-3)": the category up to the first " (", the scope inside
    category, scoped, scope = head.partition(" (")
    if not (scoped and head.endswith(")")):
        category, scope = head, ""
    return {
        "category": category,
        "message": next((ln for ln in lines[1:] if ln.strip()), ""),
        "evidence": [],
        "advice": [ln[2:] for ln in lines if ln.startswith("- ")],
        "scope": scope[:-1],
        "phases": [],
        "speedup_bound": None,
        "fit_wait_fraction": None,
        "fit_figures": {},
        "text": text,
    }


# The end of a profiler window's line: "(<size> MiB[, mean step <ms> ms])".
_WINDOW_TAIL = re.compile(r" \(([\d.]+) MiB(?:, mean step ([\d.]+) ms)?\)$")
_WINDOW_HEAD = re.compile(r"\(([^()]*)\) -> ")


def parse_window_line(text: str) -> tuple[str, str, float, float | None] | None:
    """(reason, trace folder, MiB, mean step ms) of a profiler window's text (None: not one).

    The text reads ``... (<reason>) -> <trace folder> (<size> MiB, mean step <ms> ms)``. Linear in
    the text: the tail is matched where it must end, then the first ``(<reason>) -> `` on its line.
    """
    tail = _WINDOW_TAIL.search(text)
    if tail is None:
        return None
    line_start = text.rfind("\n", 0, tail.start()) + 1
    for head in _WINDOW_HEAD.finditer(text, 0, tail.start()):
        if head.end() >= line_start:  # the trace folder ends the line the tail is on
            size, mean = float(tail.group(1)), tail.group(2)
            return head.group(1), text[head.end() : tail.start()], size, float(mean) if mean else None
    return None


def parse_findings(text: str) -> list[dict[str, str | None]]:
    """The mixed-precision findings from their Markdown list (`findings_markdown`)."""
    out: list[dict[str, str | None]] = []
    for line in text.splitlines():
        m = re.match(r"^- \[(\w+)\](?: `([^`]*)`)?: (.*)$", line.strip())
        if m:
            out.append({"kind": m.group(1), "layer": m.group(2) or None, "message": m.group(3)})
    return out


def figures_of(summary: str) -> dict[str, float]:
    """The whole-run figures of an InputBoundDetector summary's table."""
    out = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in _SUMMARY_ROWS:
            v = rows.finite(cells[1])
            if v is not None:
                out[_SUMMARY_ROWS[cells[0]]] = v
    return out


def parse_device_table(text: str) -> list[dict[str, str]]:
    """The GPU table's rows from the Markdown table of `gpu/devices`."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].isdigit():
            gpus.append(
                {
                    "index": cells[0],
                    "name": cells[1],
                    "uuid": cells[2],
                    "memory": f"{cells[3]} MiB",
                    "compute capability": cells[4],
                }
            )
    return gpus
