"""The log layout: every run name, tag and key that a callback writes and the report reads.

Writers (the callbacks and the features they use) and readers (``reporting``, ``live``) import
these names rather than spelling the strings, so the layout changes in one place. Scalar keys
are also the keys of Keras's ``History``: lowercase, slash-grouped, with the unit in the name.
"""

from __future__ import annotations

import os
import re
import socket

# -- Runs: one TensorBoard run per callback, split per process in a job of several.
PROCESS_RUN_PREFIX = "process_"
JOB_RUN = "job"  # the job-wide figures, written by process 0
PROCESS_RUN_RE = re.compile(r"^(?:(.+)/)?process_(\d+)$")
JOB_RUN_RE = re.compile(r"^(?:(.+)/)?job$")
# A second training writing the log directory at the same time: its runs one level down (logdir/claim.py).
TRAINING_NAME_RE = re.compile(r"^[A-Za-z0-9.\-]+_pid\d+$")
TRAINING_RUN_RE = re.compile(r"^(.+)/([A-Za-z0-9.\-]+_pid\d+)$")


def process_run(index: int) -> str:
    """The run name of process ``index`` of a job."""
    return f"{PROCESS_RUN_PREFIX}{index}"


def training_run(host: str | None = None, pid: int | None = None) -> str:
    """The name under each run of a training that found another writing its log directory: ``<host>_pid<pid>``."""
    host = re.sub(r"[^A-Za-z0-9.\-]", "-", host if host is not None else socket.gethostname()) or "host"
    return f"{host}_pid{os.getpid() if pid is None else pid}"


# -- Text and JSON tags. A callback writes a readable text under a tag (TensorBoard's Text tab) and,
# for the report, the same content as JSON under the tag plus DATA_SUFFIX, as a string tensor of the
# plugin DATA_PLUGIN, which no TensorBoard dashboard shows (see EventWriter.json). Logs of earlier
# versions hold the JSON as text (plugin TEXT_PLUGIN); the reader reads both.
DATA_SUFFIX = "/data"
DATA_PLUGIN = "keras_gpu_tools_data"
TEXT_PLUGIN = "text"
GPU_DEVICES = "gpu/devices"
GPU_DEVICES_DATA = GPU_DEVICES + DATA_SUFFIX  # GPUUtilizationLogger.device_records()
INPUT_VERDICT = "input/verdict"
# {scope, verdict, measurement (the steady state's), figures, fit_figures (the whole fit's), notes, job}
INPUT_VERDICT_DATA = INPUT_VERDICT + DATA_SUFFIX
INPUT_JOB_VERDICT = "input/job_verdict"  # the job run's text (process 0)
OOM_EVENTS_DATA = "oom/events" + DATA_SUFFIX  # one OOMEvent per recovery
OOM_EXPLANATION = "oom/explanation"
OOM_HEADROOM_DATA = "oom/headroom" + DATA_SUFFIX  # per device: peak, capacity, the batch that would fit
OOM_EVENTS_DIR = "oom_events"  # a folder in the run: one explanation file per event
PLAN_RUN = "plan"  # the run plan_batch_size(log_dir=...) writes to
PLAN_SUMMARY = "plan/summary"  # str(BatchPlan): the plan, why, and its candidates' table
PLAN_SUMMARY_DATA = PLAN_SUMMARY + DATA_SUFFIX  # BatchPlan.as_dict() (candidates: Candidate rows)
PLAN_FIGURE = "plan/throughput"  # an image: samples/s and peak memory against the batch size
PLAN_SAMPLES_PER_SEC = "plan/samples_per_sec"  # scalar per measured candidate, the step is its batch size
PLAN_PEAK_MIB = "plan/peak_mib"  # scalar per candidate with a known peak, the step is its batch size
SPEEDUPS_RUN = "speedups"  # the run find_speedups(log_dir=...) writes to
SPEEDUPS_SUMMARY = "speedups/summary"  # SpeedupReport.to_markdown(): every change's row
SPEEDUPS_SUMMARY_DATA = SPEEDUPS_SUMMARY + DATA_SUFFIX  # SpeedupReport.as_dict() (rows: SpeedupRow)
SPEEDUPS_FIGURE = "speedups/chart"  # an image: a bar per measured change, its speed-up and uncertainty
SPEEDUPS_SPEEDUP = "speedups/speedup"  # scalar per measured row (after / before), the step is the row's place
MEMORY_VERDICT = "memory/verdict"  # MemoryLeakDetector's verdict as text
# {verdict (LeakVerdict), epochs [{epoch, figures}], fits [{fit, host_rss_mib, device_in_use_mib, ...}]}
MEMORY_VERDICT_DATA = MEMORY_VERDICT + DATA_SUFFIX
MIXED_PRECISION_FINDINGS = "mixed_precision/findings"
MIXED_PRECISION_FINDINGS_DATA = MIXED_PRECISION_FINDINGS + DATA_SUFFIX  # [MixedPrecisionFinding]
REPORT_SUMMARY = "report/summary"
INPUT_PIPELINE = "input_pipeline"  # profile/steps_<first>_<last>/input_pipeline[/data]: TraceAnalysis
INPUT_PIPELINE_DATA_SUFFIX = f"/{INPUT_PIPELINE}{DATA_SUFFIX}"


def window_label(start: int, stop: int) -> str:
    """A profiled window's name in tags and trace folders: its first and last step, counted from 1.

    The steps ``start`` to ``stop`` (exclusive, counted from 0) are ``steps_21_25`` for ``(20, 25)``:
    the steps every view calls "steps 21-25". Logs of earlier versions named them ``steps_20_25``.
    """
    return f"steps_{start + 1}_{stop}"


def profile_window(start: int, stop: int) -> str:
    """The tag of a profiled window of steps ``start`` to ``stop`` (exclusive, from 0): ``profile/steps_21_25``."""
    return f"profile/{window_label(start, stop)}"


# -- Scalar keys (History and TensorBoard scalars).
def gpu_key(label: str | int, field: str) -> str:
    """The key of one GPU's figure, e.g. ``gpu/0/utilization_percent``."""
    return f"gpu/{label}/{field}"


GPU_KEY_RE = re.compile(r"^gpu/([^/]+)/(.+)$")
# The logger's epoch figures of each GPU (the values History gets: epoch means, `<field>_max`, the health
# fields' shares and sums), written once an epoch at its last step. The report reads one value per epoch
# from them; the sampled series `gpu/<label>/<field>` (a point every `interval`) are apart. Logs written
# before these tags have no per-epoch GPU figures.
GPU_EPOCH_PREFIX = "gpu_epoch/"
GPU_EPOCH_KEY_RE = re.compile(r"^gpu_epoch/([^/]+)/(.+)$")


def gpu_epoch_figures(values: dict[str, float]) -> dict[str, float]:
    """The GPU keys of an epoch's figures (``gpu/<label>/<field>``) as their epoch tags; other keys left out."""
    return {GPU_EPOCH_PREFIX + k[4:]: v for k, v in values.items() if k.startswith("gpu/")}  # (cheap: no regex)


GPU_UTILIZATION = "utilization_percent"  # the GPU figure Keras's progress bar shows (the first GPU's)
HOST_RSS_MIB = "host/rss_mib"
HOST_CPU_PERCENT = "host/cpu_percent"
HOST_SYSTEM_CPU_PERCENT = "host/system_cpu_percent"

INPUT_STEPS = "input/steps"
INPUT_WAIT_FRACTION = "input/wait_fraction"
INPUT_WAIT_MS = "input/wait_ms"
INPUT_COMPUTE_MS = "input/compute_ms"
INPUT_OTHER_MS = "input/other_ms"
INPUT_STEP_MS = "input/step_ms"
STEPS_PER_SEC = "throughput/steps_per_sec"
SAMPLES_PER_SEC = "throughput/samples_per_sec"
FLOPS_PER_SEC = "throughput/flops_per_sec"
FLOPS_PER_SEC_PER_DEVICE = "throughput/flops_per_sec_per_device"
MFU = "throughput/mfu"
# The logger's record of the GPU fields a GPU or driver cannot report, written once a fit in its run:
# text (a readable list) and JSON {gpu label: {field: reason}} under this tag + DATA_SUFFIX.
GPU_UNSUPPORTED_TEXT = "gpu/unsupported_fields"
JOULES_PER_SAMPLE = "throughput/joules_per_sample"  # the epoch's GPU energy over its samples

# MemoryLeakDetector, per epoch: this process's memory at the epoch's end, and its growth (a robust slope
# over the epochs after the warm-up; absent until three of them are seen).
MEMORY_HOST_RSS_MIB = "memory/host_rss_mib"  # this process's resident memory
MEMORY_DEVICE_IN_USE_MIB = "memory/device_in_use_mib"  # the framework allocator's bytes in use, every device summed
MEMORY_DEVICE_RESERVED_MIB = "memory/device_reserved_mib"  # what the allocator holds from the device (torch, JAX)
MEMORY_LIVE_TENSORS = "memory/live_tensors"  # live objects of the framework's tensor types
MEMORY_LIVE_TENSOR_MIB = "memory/live_tensor_mib"  # their bytes
MEMORY_COMPILED_FUNCTIONS = "memory/compiled_functions"  # traces of the model's train/test/predict functions
MEMORY_HOST_GROWTH = "memory/host_rss_growth_mib_per_epoch"
MEMORY_DEVICE_GROWTH = "memory/device_growth_mib_per_epoch"

OOM_EVENTS = "oom/events"  # per epoch
OOM_EVENTS_TOTAL = "oom/events_total"
OOM_MICRO_BATCHES = "oom/micro_batches"

JOB_STEP_MS_MAX = "job/step_ms_max"
JOB_STEP_MS_SLOWEST_PROCESS = "job/step_ms_slowest_process"
JOB_INPUT_WAIT_FRACTION_MAX = "job/input_wait_fraction_max"
JOB_INPUT_WAIT_PROCESS = "job/input_wait_process"
JOB_SAMPLES_PER_SEC = "job/samples_per_sec"


def job_gpu_key(metric: str, stat: str) -> str:
    """The job-wide statistic of one GPU figure over every GPU of the job, e.g. ``job/gpu/utilization_percent_max``."""
    return f"job/gpu/{metric}_{stat}"


# The key groups this package writes into History (a key under another prefix is the user's or Keras's).
OWN_PREFIXES = ("gpu/", "host/", "input/", "throughput/", "job/", "oom/", "memory/", "step/")

# -- JSON keys of the records above that the report reads.
JOB = "job"  # the job's verdict inside INPUT_VERDICT_DATA
PROCESS_INDEX = "process_index"
PROCESS_COUNT = "process_count"
HOST = "host"

GPU_PREFIX = "gpu/"
HOST_PREFIX = "host/"
PROFILE_PREFIX = "profile/"

# -- What the report reads by prefix, and the runs and tags of Keras's own TensorBoard callback.
INPUT_PREFIX = "input/"
THROUGHPUT_PREFIX = "throughput/"
OOM_PREFIX = "oom/"
MEMORY_PREFIX = "memory/"
JOB_PREFIX = "job/"
KERAS_EPOCH_PREFIX = "epoch_"  # Keras's epoch logs: epoch_loss, epoch_accuracy, ...
KERAS_TRAIN_RUN = "train"
KERAS_VALIDATION_RUN = "validation"


# -- InputBoundDetector's step breakdown, per epoch (History and TensorBoard, run of the detector).
# Compilation (first call and retraces) is reported apart; the other parts are the steady step's and
# add up to STEP_STEP_MS. A part that cannot be told apart is left out (its time stays in another).
STEP_COMPILE_SECONDS = "step/compile_seconds"  # seconds of compile/trace calls beyond a normal step, this epoch
STEP_RETRACES = "step/retraces"  # traces of the train step beyond its first, this epoch (exact)
STEP_INPUT_MS = "step/input_ms"  # waiting for input per step (= input/wait_ms)
STEP_DISPATCH_MS = "step/dispatch_ms"  # host time launching the step that the device waits for
STEP_COMPUTE_MS = "step/compute_ms"  # device compute per step, collectives left out where estimated
STEP_COLLECTIVE_MS = "step/collective_ms"  # the gradient all-reduce per step (several devices, where estimated)
STEP_OTHER_MS = "step/other_ms"  # the rest: callbacks, Python between steps
STEP_STEP_MS = "step/step_ms"  # the steady step time the parts add up to
STEP_BREAKDOWN = "step/breakdown"  # text: the fit's breakdown, its largest part and the advice
STEP_BREAKDOWN_DATA = STEP_BREAKDOWN + DATA_SUFFIX  # the same as JSON, for the report


# ---------------------------------------------------------------------------
# ProfilerWindow's time per Keras layer (profiling/layer_table.py writes, reporting/ reads)
# ---------------------------------------------------------------------------
LAYERS = "layers"  # profile/steps_<first>_<last>/layers: the window's layer table as Markdown text
LAYERS_DATA_SUFFIX = f"/{LAYERS}{DATA_SUFFIX}"  # .../layers/data: the LayerTable as JSON (rows heaviest first)
LAYERS_CHART_SUFFIX = "/chart"  # .../layers/chart: an image, a bar chart of the heaviest layers' ms per step


def profile_layers(start: int, stop: int) -> str:
    """The tag of the layer table of the profiled window of steps ``start`` to ``stop`` (exclusive)."""
    return f"{profile_window(start, stop)}/{LAYERS}"
