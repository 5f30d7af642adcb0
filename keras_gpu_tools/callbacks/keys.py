"""The keys each callback logs, as the Markdown tables of docs/keys.md and the README.

Every key is spelt by ``keras_gpu_tools.logdir.schema`` (the GPU fields by the telemetry's field tables);
this module only adds units and meanings. ``docs/gen_keys.py`` writes the tables into the docs, and a
test checks that the committed docs are what it would write. Imports no framework.
"""

from __future__ import annotations

import dataclasses
import re

from keras_gpu_tools.logdir import schema

README_TABLE = re.compile(r"(<!-- keys:begin (\S+) -->\n)(.*?)(<!-- keys:end -->)", re.S)
REGENERATE = "python docs/gen_keys.py"


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a callback's epoch logs (History, CSVLogger) and TensorBoard run."""

    key: str
    unit: str
    meaning: str
    history: bool = True  # False: written to TensorBoard only


@dataclasses.dataclass(frozen=True)
class KeyTable:
    """A callback's keys of one kind; ``name`` marks the table in the README (``<!-- keys:begin NAME -->``)."""

    name: str
    callback: str
    intro: str
    rows: tuple[Key, ...]

    def markdown(self) -> str:
        lines = ["| key | unit | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{k.key}` | {k.unit} | {k.meaning} |" for k in self.rows]
        return "\n".join(lines) + "\n"


_UNITS = ("%", "MiB", "MiB/s", "W", "deg", "MHz", "J")


def _gpu_field(field: str, doc: str) -> tuple[str, str]:
    """(unit, meaning) of a telemetry field's doc, written "meaning, unit" where it has a unit."""
    meaning, _, unit = doc.rpartition(", ")
    if meaning and unit.split(" ")[0] in _UNITS:
        return unit, meaning
    return "count", doc


def _gpu_rows() -> tuple[Key, ...]:
    from keras_gpu_tools.telemetry.aggregate import MAX_KEYS
    from keras_gpu_tools.telemetry.job import JOB_METRICS
    from keras_gpu_tools.telemetry.sampler import GPU_FIELDS, HOST_FIELDS

    rows = []
    for prefix, fields in ((schema.gpu_key("<i>", ""), GPU_FIELDS), (schema.HOST_PREFIX, HOST_FIELDS)):
        for field, doc in fields.items():
            unit, meaning = _gpu_field(field, doc)
            rows.append(Key(prefix + field, unit, meaning))
            if field in MAX_KEYS:
                rows.append(Key(f"{prefix}{field}_max", unit, "the epoch's maximum of the same"))
    rows.append(Key(schema.JOULES_PER_SAMPLE, "J", "the epoch's energy over every GPU of the process per example"))
    for metric in JOB_METRICS:
        for stat in ("min", "mean", "max"):
            rows.append(Key(schema.job_gpu_key(metric, stat), "as the GPU's", f"{stat} over every GPU of a job"))
    return tuple(rows)


_INPUT = (
    Key(schema.INPUT_STEPS, "steps", "training steps the figures cover (their weight when adding up)"),
    Key(schema.INPUT_WAIT_FRACTION, "0..1", "share of the step time spent waiting for input"),
    Key(schema.INPUT_WAIT_MS, "ms", "waiting for input per step (the part compute did not hide)"),
    Key(schema.INPUT_COMPUTE_MS, "ms", "step compute on the device (low end of synced steps)"),
    Key(schema.INPUT_OTHER_MS, "ms", "the rest: callbacks, Python, dispatch"),
    Key(schema.INPUT_STEP_MS, "ms", "the steady step time, compilation apart: the one every view reads"),
    Key(schema.STEPS_PER_SEC, "1/s", "training steps per second: `1000 / input/step_ms`"),
    Key(
        schema.SAMPLES_PER_SEC,
        "1/s",
        "examples per second: the mean examples per step (a partial last batch counted) times the steps per second",
    ),
    Key(schema.FLOPS_PER_SEC, "FLOP/s", "achieved by the step, every device of it together, where the FLOPs are known"),
    Key(schema.FLOPS_PER_SEC_PER_DEVICE, "FLOP/s", "the same per device that runs the step"),
    Key(schema.MFU, "0..1", "model FLOPs utilization: against the summed dense peaks of the step's devices"),
)
_STEP = (
    Key(
        schema.STEP_COMPILE_SECONDS, "s", "compile/trace calls this epoch (first call, retraces), beyond a normal step"
    ),
    Key(schema.STEP_RETRACES, "count", "traces of the train step beyond its first this epoch (the framework's count)"),
    Key(
        schema.STEP_INPUT_MS,
        "ms",
        "the steady step's parts, compilation left out, adding up to `step/step_ms`: input wait (`input/wait_ms`)",
    ),
    Key(schema.STEP_DISPATCH_MS, "ms", "host launch time the device waits for (where told apart: JAX on a GPU)"),
    Key(schema.STEP_COMPUTE_MS, "ms", "device compute, collectives left out where estimated"),
    Key(
        schema.STEP_COLLECTIVE_MS,
        "ms",
        "gradient all-reduce, timed alone at fit start (several devices of one process)",
    ),
    Key(schema.STEP_OTHER_MS, "ms", "callbacks, Python; dispatch where not told apart"),
    Key(
        schema.STEP_STEP_MS,
        "ms",
        "an alias of `input/step_ms` (the epoch's), less the compile time of retraces the hook did not time",
    ),
)
_INPUT_JOB = (
    Key(schema.JOB_STEP_MS_MAX, "ms", "the slowest process's step time"),
    Key(schema.JOB_STEP_MS_SLOWEST_PROCESS, "index", "which process that is"),
    Key(schema.JOB_INPUT_WAIT_FRACTION_MAX, "0..1", "the highest input wait share"),
    Key(schema.JOB_INPUT_WAIT_PROCESS, "index", "which process that is"),
    Key(schema.JOB_SAMPLES_PER_SEC, "1/s", "the job's examples per second (every process's summed)"),
)
_MEMORY = (
    Key(schema.MEMORY_HOST_RSS_MIB, "MiB", "this process's resident memory at the epoch's end"),
    Key(schema.MEMORY_DEVICE_IN_USE_MIB, "MiB", "the framework allocator's bytes in use, every GPU summed"),
    Key(
        schema.MEMORY_DEVICE_RESERVED_MIB, "MiB", "what the allocator holds from the GPUs, cache included (torch, JAX)"
    ),
    Key(
        schema.MEMORY_LIVE_TENSORS, "count", "live tensors of the framework (every epoch on JAX; else on census epochs)"
    ),
    Key(schema.MEMORY_LIVE_TENSOR_MIB, "MiB", "their bytes"),
    Key(schema.MEMORY_COMPILED_FUNCTIONS, "count", "traces of the model's train/test/predict functions"),
    Key(schema.MEMORY_HOST_GROWTH, "MiB/epoch", "host growth since the warm-up (from 3 epochs after it)"),
    Key(schema.MEMORY_DEVICE_GROWTH, "MiB/epoch", "device growth since the warm-up (from 3 epochs after it)"),
)
_OOM = (
    Key(schema.OOM_EVENTS, "count", "out-of-memory errors recovered from in the epoch"),
    Key(schema.OOM_MICRO_BATCHES, "count", "micro-batches per batch at the end of the epoch (1 = unsplit)"),
    Key(schema.OOM_EVENTS_TOTAL, "count", "recoveries so far, at each recovery's step (TensorBoard only)", False),
)


def tables() -> list[KeyTable]:
    """Every callback's key tables, in the order of docs/keys.md."""
    epoch = "Per epoch into `logs` (History, CSVLogger) and to TensorBoard in the run `log_dir/<run_name>`"
    return [
        KeyTable(
            "GPUUtilizationLogger",
            "GPUUtilizationLogger",
            epoch + " (a point per `interval`; the epoch's figures as `gpu_epoch/<i>/<field>`). "
            "`<i>` is the GPU as the framework numbers it, or its job-wide name in a job of several processes; "
            "`job/gpu/...` only in such a job.",
            _gpu_rows(),
        ),
        KeyTable(
            "InputBoundDetector",
            "InputBoundDetector",
            epoch + " (a point per `window` steps). NaN means not yet measured, never 0.",
            _INPUT,
        ),
        KeyTable(
            "InputBoundDetector/step",
            "InputBoundDetector",
            "The step's parts, per epoch (History and the detector's run); a part that cannot be told apart is "
            "left out.",
            _STEP,
        ),
        KeyTable(
            "InputBoundDetector/job",
            "InputBoundDetector",
            "In a job of several processes, the same in every process's epoch logs; process 0 also writes them to "
            "the run `log_dir/<run_name>/job`.",
            _INPUT_JOB,
        ),
        KeyTable(
            "MemoryLeakDetector",
            "MemoryLeakDetector",
            epoch + ". Every key the fit can log is there from its first epoch: NaN means not yet measured (or "
            "not readable), never 0.",
            _MEMORY,
        ),
        KeyTable(
            "OOMBatchSizeReducer",
            "OOMBatchSizeReducer",
            epoch + " when `log_dir` is given. NaN means not yet measured.",
            _OOM,
        ),
    ]


def history_keys(callback: str) -> set[str]:
    """The keys the tables give for ``callback`` (a class name) in the epoch logs (History)."""
    return {row.key for table in tables() if table.callback == callback for row in table.rows if row.history}


def keys_markdown() -> str:
    """The text of docs/keys.md."""
    out = [
        "# Logged keys",
        "",
        "The keys each callback adds to Keras's epoch logs (`History`, `CSVLogger`) and writes to its TensorBoard",
        "run. Generated from `keras_gpu_tools/logdir/schema.py` by `keras_gpu_tools/callbacks/keys.py`: do not",
        f"edit by hand, run `{REGENERATE}`.",
    ]
    callback = None
    for table in tables():
        if table.callback != callback:
            callback = table.callback
            out += ["", f"## {callback}"]
        out += ["", table.intro, "", table.markdown().rstrip("\n")]
    return "\n".join(out) + "\n"


def readme_with_tables(text: str) -> str:
    """``text`` with each ``<!-- keys:begin NAME -->`` ... ``<!-- keys:end -->`` block holding table NAME."""
    by_name = {table.name: table for table in tables()}

    def fill(m: re.Match) -> str:
        if m.group(2) not in by_name:
            raise ValueError(f"no key table named {m.group(2)!r}; the names are {sorted(by_name)}")
        return m.group(1) + by_name[m.group(2)].markdown() + m.group(4)

    return README_TABLE.sub(fill, text)
