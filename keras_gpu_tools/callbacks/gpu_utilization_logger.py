"""GPUUtilizationLogger: per-GPU metrics in TensorBoard and the epoch logs."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from keras_gpu_tools.callbacks._base import FitCallback
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime import roles
from keras_gpu_tools.runtime.ticker import Job
from keras_gpu_tools.runtime.topology import JobGather
from keras_gpu_tools.runtime.typing_compat import override
from keras_gpu_tools.runtime.validation import (
    check_bool,
    check_devices,
    check_log_dir,
    check_number,
    check_run_dir,
    check_run_name,
)
from keras_gpu_tools.telemetry import gpus as monitored
from keras_gpu_tools.telemetry import health
from keras_gpu_tools.telemetry.aggregate import Aggregate
from keras_gpu_tools.telemetry.health_fields import SHARED_GPU_HEALTH
from keras_gpu_tools.telemetry.job import job_gpu_figures
from keras_gpu_tools.telemetry.nvml import NVML, default_nvml
from keras_gpu_tools.telemetry.sampler import (
    GPUProbe,
    HostProbe,
    MetricSampler,
    WarnOnce,
)

MAX_INTERVAL = 3600.0  # seconds: one sample an hour is already no monitoring
FIRST_SAMPLE_WAIT_S = 1.0  # at most (plus the interval), a fit's first epoch end waits for its first sample


class GPUUtilizationLogger(FitCallback, roles.GPUSampler):
    """Logs per-GPU utilization, memory, power, clocks and more while training.

    A background thread samples NVML (and the framework's allocator, and the
    host process) every `interval` seconds: the package's one thread in a
    fit(), shared with the check that cleans up after a fit() that raised.
    The training thread only counts steps: it never makes an NVML call and
    never forces a device sync, so the callback does not slow the training
    it measures. It is `async_safe`, so on JAX Keras keeps dispatching batch hooks asynchronously.

    What is logged: to TensorBoard (with `log_dir`), a point per metric every `interval` in the run
    `log_dir/<run_name>` on the global step axis (continued across `fit()` calls), the mean of the samples
    since the previous point, and at each epoch end the epoch's figures as `gpu_epoch/<i>/<field>`; readable
    on every backend. To the epoch logs (place this callback before `CSVLogger`): the epoch mean of every
    metric, plus `<key>_max` for memory, power, temperature and host memory. Keras's progress bar shows none
    of them unless asked (`progress_bar`), Keras's `TensorBoard` none. Every epoch of a fit carries the same
    keys: those of the fit's first sample (which waits 0.1 s so that CPU use and GPM rates are in it). A key
    with no fresh value in an epoch (shorter than `interval`, a metric that stopped reporting) carries its
    last known value (NaN: not yet measured), never 0. If the fit's first sample is still being taken when
    the first epoch ends, that epoch end waits for it (once, bounded by one second plus `interval`).
    Logged keys (History, CSVLogger, TensorBoard): docs/keys.md.

    In a job of several processes (`keras.distribution.initialize` on JAX,
    or a launcher's `RANK`/`WORLD_SIZE`, `SLURM_PROCID`, ...), each process
    writes its own run, `log_dir/<run_name>/process_<p>`, and names its GPUs
    by their job-wide device id (`gpu/<id>/...`), or `<host>:<NVML index>`
    where the engine gives no such id. At each epoch end the processes
    exchange their GPUs' epoch means of utilization, SM activity and memory
    used, once, over the engine's coordination service (JAX's distributed
    key-value store), and every process adds the same
    `job/gpu/<metric>_min|_mean|_max` over all GPUs of the job to its epoch
    logs; process 0 also writes them to the run `log_dir/<run_name>/job`.
    If a process does not answer within `job_timeout_s` (60 s), a warning
    is issued and the job keys are left out for the rest of the fit.
    Without a coordination service (a launcher's variables alone) nothing
    is exchanged.

    A metric a GPU cannot report (NVML says NotSupported, for example on a MIG
    instance or a consumer card) is warned about once and left out; it is
    never logged as 0. Its reason is kept: `unsupported_fields`, `summary()`,
    and once a fit the text and JSON `gpu/unsupported_fields` in the run
    (`keras-gpu-tools doctor` lists them too). Without NVML, a driver or a
    GPU, one warning is issued and the host metrics are logged alone.

    Health: `throttle_*_percent` is the share of the epoch's samples with
    that clock-event reason active; `energy_joules` the epoch's difference of
    NVML's energy counter (a TensorBoard point: joules since the previous
    one); `xid_events` the driver's XID errors, each warned about at once.
    `throughput/joules_per_sample` needs the epoch's examples: known for
    arrays without `steps_per_epoch`, absent for datasets and generators.
    Other callbacks read the last epoch through
    `FitSession.shared["gpu_health"]` (a `GPUHealthSource`).

    GPUs are those the process can use: `CUDA_VISIBLE_DEVICES` is mapped to
    NVML entry by entry (UUIDs, MIG UUIDs or indices). Integer entries follow
    NVML's PCI bus order; set `CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA agrees on
    machines with mixed GPU models.

    Args:
        log_dir: directory of the TensorBoard logs (the same you give Keras's
            `TensorBoard` callback), or None to log to the epoch logs only.
            Defaults to `"logs"`.
        interval: seconds between samples, at most 3600 (utilization, power,
            PCIe and ECC at most once a second). Defaults to `0.25`.
        devices: GPUs to monitor: indices as the framework numbers them
            (`0` is `GPU:0`) or UUID strings; None monitors every visible
            GPU. Defaults to `None`.
        pcie: whether to sample PCIe throughput, which blocks the sampling
            thread about 20 ms per GPU and direction. Defaults to `True`.
        gpm: whether to read SM activity, SM occupancy and tensor activity
            from NVML's GPM where the GPU supports it (Hopper and later).
            Defaults to `True`.
        epoch_logs: whether to add the epoch means to `logs`. Defaults to
            `True`.
        progress_bar: which of them Keras's progress bar shows: `"brief"`
            (the first GPU's utilization, unless an `InputBoundDetector`'s
            field is shown), `"all"` or `"none"`. Defaults to `"none"`.
        run_name: name of the TensorBoard run under `log_dir`. Defaults to
            `"gpu"`.
        nvml: an `NVML` accessor to use instead of the process-wide one (for
            tests with a fake NVML). Defaults to `None`.

    Example:

    ```python
    from keras_gpu_tools import GPUUtilizationLogger

    model.fit(x, y, epochs=5, callbacks=[
        GPUUtilizationLogger(log_dir="logs"),
        keras.callbacks.TensorBoard(log_dir="logs"),
    ])
    # tensorboard --logdir logs   (the "gpu" run holds the GPU series)
    ```
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = "logs",
        interval: float = 0.25,
        devices: Sequence[int | str] | None = None,
        pcie: bool = True,
        gpm: bool = True,
        epoch_logs: bool = True,
        run_name: str = "gpu",
        nvml: NVML | None = None,
        progress_bar: str = "none",
    ):
        super().__init__()
        # Bounded: the session's thread waits `interval` seconds between samples, and a
        # wait beyond the platform's limit (about 2**33 s) kills it with OverflowError.
        self.interval = check_number(
            "interval", interval, low=0, exclusive_low=True, high=MAX_INTERVAL, what="number of seconds"
        )
        self.devices = check_devices("devices", devices)
        self.pcie = check_bool("pcie", pcie)
        self.gpm = check_bool("gpm", gpm)
        self.epoch_logs = check_bool("epoch_logs", epoch_logs)
        self.progress_bar = progress_bar  # checked by the base class
        self.run_name = check_run_name("run_name", run_name)
        self.log_dir = check_log_dir("log_dir", log_dir)
        check_run_dir(self.log_dir, self.run_name)
        self._nvml = nvml

        self.gpus: list[Any] = []  # (index, GPUInfo) monitored in the last fit
        self.epoch_history: list[dict[str, float]] = []
        # (wall_time, step, means) of each point
        self.timeline: collections.deque[tuple[float, int, dict[str, float]]] = collections.deque(maxlen=100_000)
        self.warnings = WarnOnce()
        self._lock = threading.Lock()
        self._steps_cap = 1 << 62  # the fit's steps per epoch, where Keras knows them
        self._running = False
        self._job: Job | None = None  # the sampling, on the fit session's thread
        self._sampler: MetricSampler | None = None
        self._point = Aggregate()
        self._epoch = Aggregate()
        self._last_sample: dict[str, float] = {}
        self._last_written_step = -1
        self._first_sample = threading.Event()
        self._labels: dict[int, str] = {}  # framework index -> the GPU's name in the keys
        self._gather: JobGather | None = None
        self._health = health.HealthRecord(dict)
        self._epoch_samples: int | None = None  # examples per epoch, where fit()'s data says

    _bar_priority = 1  # an InputBoundDetector's input wait comes first

    # -- properties ---------------------------------------------------------
    def latest(self) -> dict[str, float]:
        """The most recent sample (empty before the first one)."""
        with self._lock:
            return dict(self._last_sample)

    @property
    def unsupported_fields(self) -> dict[str, dict[str, str]]:
        """GPU label -> field -> why this GPU or driver does not report it (the last fit's, so far)."""
        return self._health.unsupported()

    def summary(self) -> str:
        """The GPUs monitored in the last fit, their last epoch's health, and the fields they cannot report."""
        return health.summary_text(self._health, list(self._labels.values()))

    # -- Keras hooks ----------------------------------------------------------
    @override
    def _start_fit(self, session) -> None:
        self._count_on()  # from the last fit's steps (under that fit's cap)
        steps = self.params.get("steps") if self.params else None
        self._steps_cap = int(steps) if steps else 1 << 62
        warn, nvml = self.warnings, self._nvml or default_nvml()
        self.gpus = monitored.resolve_devices(nvml, self.devices, warn)
        self._labels = {i: monitored.device_label(self.topology, i, g) for i, g in self.gpus}
        probes = [GPUProbe(nvml, i, g, warn, pcie=self.pcie, gpm=self.gpm, label=self._labels[i]) for i, g in self.gpus]
        allocator = self.backend.allocator_memory if self.gpus else None
        events = health.XidWatcher(nvml, probes, warn) if probes else None
        self._sampler = sampler = MetricSampler(probes, HostProbe(warn), allocator, warn, events)
        self._health = session.shared[SHARED_GPU_HEALTH] = health.HealthRecord(sampler.unsupported)
        self._epoch_samples = ki.array_epoch_samples(self.model)
        self._gather = self._job_gather()
        self._open_writers(job=self._gather.active)
        if self._writer is not None and self.gpus:
            table = monitored.device_table(self.topology, self.gpus, self._labels)
            self._writer.text(schema.GPU_DEVICES, table, step=self._global_step)
            self._writer.json(schema.GPU_DEVICES_DATA, self.device_records(), step=self._global_step)  # for report()
        with self._lock:
            self._point = Aggregate()
            self._epoch = Aggregate()
        self._first_sample.clear()
        self._running = True
        self._job = session.every(self.interval, self._tick, self._on_error)

    @override
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batch = batch  # the only per-step work; the step is worked out where it is read

    @property
    def _global_step(self) -> int:
        # With steps_per_execution=N, Keras reports the last step of the execution, also for a
        # last, partial one (index 15 in an epoch of 15 steps): capped by the epoch's steps where known.
        return self._epoch_base + min(self._batch + 1, self._steps_cap)

    @_global_step.setter
    def _global_step(self, step: int) -> None:
        # The epoch's batches first: the sampling thread reads the base, then the batch, so
        # between the two stores it sees a step too low (a point it skips), never one too high.
        self._batch = -1
        self._epoch_base = step

    def _count_on(self) -> None:
        """A new epoch or fit: its batches count on from the steps seen so far."""
        self._global_step = self._global_step

    @override
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        with self._lock:  # what was sampled since the last epoch end: only its counts (energy, XID events)
            self._epoch = self._epoch.counts_only()

    @override
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._count_on()
        if not self._first_sample.is_set() and self._running:
            # An epoch shorter than the first sample: wait for it, once per fit, so every epoch has the same keys.
            self._first_sample.wait(FIRST_SAMPLE_WAIT_S + self.interval)
        with self._lock:
            agg, self._epoch = self._epoch, Aggregate()
        # The same keys every epoch (those of the fit's first sample), so History's
        # lists line up with the epochs and CSVLogger keeps every column.
        sampler = self._sampler
        values = sampler.end_epoch(agg) if sampler is not None else agg.summary()
        try:
            job = job_gpu_figures(epoch, values, list(self._labels.values()), self.topology, self._gather)
            if job and (job_writer := self._job_events()) is not None:
                job_writer.scalars(job, step=self._global_step)
            values.update(job)
        except Exception as e:  # monitoring never stops training: the job figures stop instead
            self._job_failed(self._gather, e)
        per_sample = self._health.end_epoch(values, self._epoch_samples)
        if self._writer is not None:  # each GPU's epoch figures (as History's), written by the sampling thread
            self._writer.scalars_later({**schema.gpu_epoch_figures(values), **per_sample}, step=self._global_step)
        values.update(per_sample)
        self.epoch_history.append(values)
        if self.epoch_logs:
            first = next(iter(self._labels.values()), None)
            brief = schema.gpu_key(first, schema.GPU_UTILIZATION) if first is not None else None
            self._epoch_figures(values, logs, brief=brief)

    # -- internals ------------------------------------------------------------
    def _tick(self) -> None:
        assert self._sampler is not None  # made before the sampling job that calls here starts
        sample = self._sampler.sample()
        now = time.time()
        with self._lock:
            self._point.add(sample)
            self._epoch.add(sample)
            self._last_sample = sample
        self._first_sample.set()
        self._write_point(now)

    def _write_point(self, now: float) -> None:
        step = self._global_step
        if self._writer is not None:
            self._writer.write_later()  # the epoch records handed over since the last point
        with self._lock:
            if not self._point.count or step <= self._last_written_step:
                return
            means = self._point.means()
            self._point = Aggregate()
            self._last_written_step = step
        self.timeline.append((now, step, means))
        if self._writer is not None:
            self._writer.scalars(means, step=step, wall_time=now)

    def _on_error(self, error: BaseException) -> None:
        self.warnings(
            ("tick", type(error).__name__),
            f"GPUUtilizationLogger: sampling failed ({type(error).__name__}: {error}); it goes on.",
        )

    @override
    def _stop_fit(self, aborted: bool) -> None:
        self._running = False
        job, self._job = self._job, None
        if job is not None:
            job.stop()
        try:
            self._write_point(time.time())  # what was sampled since the last point
            if self._writer is not None and self._sampler is not None and self.gpus:
                health.write_unsupported(self._writer, self._sampler.unsupported(), self._global_step)
        finally:
            if self._sampler is not None:
                self._sampler.close()  # also frees the XID event set
            self._close_writers()

    def device_records(self) -> list[dict[str, Any]]:
        """The GPUs monitored in the last fit as JSON-ready dicts, as written to `gpu/devices/data`.

        `index` is the framework's, `label` the GPU's name in the keys
        (`gpu/<label>/...`); `process_index`, `process_count` and `host` say
        which process of the job monitored it.
        """
        return monitored.device_records(self.topology, self.gpus, self._labels)
