"""InputBoundDetector: a measured verdict on whether the input pipeline starves the GPU."""

from __future__ import annotations

import logging
import numbers
import os
import threading
import time
from typing import Any

import keras

from keras_gpu_tools._core import backends, compat, gpu_peaks
from keras_gpu_tools._core.gpu_sampler import WarnOnce
from keras_gpu_tools._core.lifecycle import FitGuard
from keras_gpu_tools._core.step_hook import Attachment, StepHook
from keras_gpu_tools._core.step_timing import (
    UNKNOWN,
    Measurement,
    StepRecord,
    StepStats,
    Verdict,
    summary_text,
    validate_thresholds,
    verdict_for,
)
from keras_gpu_tools._core.tensorboard import EventWriter, check_log_dir
from keras_gpu_tools.errors import InputPipelineWarning

logger = logging.getLogger("keras_gpu_tools")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected a positive integer."
        )
    return int(value)


class _CpuMeter:
    """Whole-machine CPU use between two calls, without touching psutil's shared state."""

    def __init__(self):
        try:
            import psutil

            self.psutil = psutil
            self.start = psutil.cpu_times()
        except Exception:
            self.psutil = None

    def read(self) -> dict[str, float]:
        if self.psutil is None:
            return {}
        try:
            now = self.psutil.cpu_times()
            total = sum(now) - sum(self.start)
            idle = (now.idle + getattr(now, "iowait", 0.0)) - (self.start.idle + getattr(self.start, "iowait", 0.0))
            self.start = now
            if total <= 0:
                return {}
            return {
                "system_cpu_percent": 100.0 * (1.0 - idle / total),
                "cpu_count": float(self.psutil.cpu_count() or 0),
            }
        except Exception:
            return {}


def _flops_of(cost) -> float | None:
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    try:
        flops = float((cost or {}).get("flops", 0.0))
    except (TypeError, ValueError, AttributeError):
        return None
    return flops if flops > 0 else None


class InputBoundDetector(keras.callbacks.Callback):
    """Measures, while training runs, whether the input pipeline starves the device.

    For every training step it splits the time into waiting for the next batch
    (host side, the iterator's `next()`), computing the step on the device, and
    the rest (callbacks, Python). It hooks `model.train_function` for the
    duration of `fit()` (one shared hook, restored afterwards, also after a
    fit that raised). Computing time needs a device sync, which would remove
    the overlap of input and compute that fast pipelines rely on, so only
    every `sample_every`-th step is synced; the others run untouched and give
    the real step rate.

    The verdict uses the thresholds of TensorBoard's input-pipeline analyzer
    (xprof): at least 20% of step time waiting for input is "highly
    input-bound", at least 5% "moderately input-bound", else "not
    input-bound". It is given per window of `window` steps (TensorBoard), per
    epoch (printed when `verbose`, and in TensorBoard's text tab) and for the
    whole fit (`detector.verdict`, `detector.summary()`, printed at the end),
    with advice that fits the pipeline found (tf.data transformations,
    PyDataset workers, DataLoader workers, arrays) and the host CPU load. When
    a `GPUUtilizationLogger` runs in the same fit, its GPU utilization over
    the same period is quoted as evidence.

    Logged keys (per epoch into `logs`; per window to TensorBoard in the run
    `log_dir/<run_name>` on the global step axis). A figure that cannot be
    measured is left out, never logged as 0:

    | key | unit | meaning |
    |---|---|---|
    | `input/wait_fraction` | 0..1 | share of the step time spent waiting for input |
    | `input/wait_ms` | ms | waiting for input per step (the part compute did not hide) |
    | `input/fetch_ms` | ms | host time in the iterator's `next()` per step |
    | `input/compute_ms` | ms | step compute on the device (median of synced steps) |
    | `input/other_ms` | ms | the rest: callbacks, Python, dispatch |
    | `input/step_ms` | ms | time per training step |
    | `throughput/steps_per_sec` | 1/s | training steps per second |
    | `throughput/samples_per_sec` | 1/s | examples per second |
    | `throughput/flops_per_sec` | FLOP/s | achieved, where the FLOPs are known |
    | `throughput/mfu` | 0..1 | model FLOPs utilization against the GPU's dense peak |

    FLOPs come from XLA's cost analysis of the step on JAX (its HLO, computed
    once per fit at the first epoch end; where the installed JAX offers no
    such analysis, the matmul and convolution FLOPs of the step's jaxpr;
    `flops_source` says which), or from `flops_per_step`; the peak from a
    table of NVIDIA GPUs by NVML name and compute dtype (or from
    `peak_flops`). MFU is left out where either is unknown (TensorFlow and
    torch report no FLOPs by themselves).

    How the step is split: the wait that counts is the part of the fetch the
    device could not hide, `min(fetch, step - compute)`, where `step` is the
    real rate of the unsynced steps; where input and compute run one after
    the other this is the whole fetch. On TensorFlow the Python fetch of a
    sampled step costs ~0.1 ms more than Keras's in-graph fetch (a fixed part
    is measured and subtracted), so steps under ~3 ms may read a few percent
    high there.

    Per backend: the fetch is timed on every step on JAX and torch, and on
    sampled steps on TensorFlow, where a sampled step pulls its batch in
    Python and runs Keras's per-batch step function (traced once more, the
    first time). With `steps_per_execution=N` on TensorFlow, a sampled
    execution pulls its N batches and runs them one call each, so it is
    measured per execution and its compute includes the per-step dispatch that
    the compiled N-step loop avoids; the summary says so. The detector never
    changes what is trained: the same batches, in the same order, the same
    number of steps.

    Args:
        window: steps per window verdict and TensorBoard point. Defaults to
            `100`.
        sample_every: sync and time in full every `sample_every`-th step
            (and steps 2 to 4 of each fit, and the last step of each
            epoch, whose sync closes the epoch's timing). The default keeps the overhead
            under 2% on a GPU step of about 2 ms (each synced step costs
            the overlap of about one step). Defaults to `100`.
        moderate_threshold: wait fraction from which a run is moderately
            input-bound. Defaults to `0.05`.
        high_threshold: wait fraction from which a run is highly
            input-bound. Defaults to `0.2`.
        log_dir: directory of the TensorBoard logs (the same as Keras's
            `TensorBoard` callback), or None for no TensorBoard output.
            Defaults to `"logs"`.
        run_name: name of the TensorBoard run under `log_dir`. Defaults to
            `"input"`.
        verbose: 1 prints a line per epoch and the report at the end of
            training; 0 prints nothing. Defaults to `1`.
        gpu_logger: the `GPUUtilizationLogger` whose figures to quote;
            `"auto"` finds one among the callbacks of the same `fit()` call
            (by reading fit()'s callback list); None uses none. Defaults to
            `"auto"`.
        epoch_logs: whether to add the epoch figures to `logs`. Defaults to
            `True`.
        flops_per_step: FLOPs of one training step, if you know them better
            than the backend (None: XLA cost analysis on JAX). Defaults to
            `None`.
        peak_flops: the device's peak FLOP/s to compute MFU against (None:
            from the table, for NVIDIA GPUs). Defaults to `None`.

    Example:

    ```python
    from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector

    detector = InputBoundDetector(log_dir="logs")
    model.fit(dataset, epochs=3, callbacks=[detector])
    print(detector.verdict.category)   # "highly input-bound", ...
    print(detector.summary())          # figures and what to change
    ```
    """

    async_safe = True

    def __init__(
        self,
        window: int = 100,
        sample_every: int = 100,
        moderate_threshold: float = 0.05,
        high_threshold: float = 0.2,
        log_dir: str | os.PathLike | None = "logs",
        run_name: str = "input",
        verbose: int = 1,
        gpu_logger: Any = "auto",
        epoch_logs: bool = True,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
    ):
        super().__init__()
        self.window = _positive_int("window", window)
        self.sample_every = _positive_int("sample_every", sample_every)
        validate_thresholds(moderate_threshold, high_threshold)
        self.moderate_threshold = float(moderate_threshold)
        self.high_threshold = float(high_threshold)
        for name, value in (("flops_per_step", flops_per_step), ("peak_flops", peak_flops)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0):
                raise ValueError(
                    f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected a number > 0 or None."
                )
        if not isinstance(run_name, str) or not run_name or os.sep in run_name or run_name in (".", ".."):
            raise ValueError(
                f"Invalid value for argument `run_name`. Received: run_name={run_name!r}. Expected a non-empty directory name."
            )
        if verbose not in (0, 1, True, False):
            raise ValueError(f"Invalid value for argument `verbose`. Received: verbose={verbose!r}. Expected 0 or 1.")
        if not (gpu_logger is None or gpu_logger == "auto" or hasattr(gpu_logger, "timeline")):
            raise TypeError(
                "Invalid value for argument `gpu_logger`. "
                f"Received: gpu_logger={gpu_logger!r}. Expected a GPUUtilizationLogger, 'auto' or None."
            )
        self.log_dir = check_log_dir(log_dir)
        self.run_name = run_name
        self.verbose = int(verbose)
        self.gpu_logger = gpu_logger
        self.epoch_logs = bool(epoch_logs)
        self.flops_per_step = float(flops_per_step) if flops_per_step else None
        self.peak_flops = float(peak_flops) if peak_flops else None

        self.warnings = WarnOnce(InputPipelineWarning)
        self.verdict: Verdict | None = None
        self.measurement: Measurement | None = None
        self.epoch_history: list[dict[str, float]] = []
        self.epoch_verdicts: list[Verdict] = []
        self.window_verdicts: list[tuple[int, Verdict]] = []  # (global step, verdict)
        self.pipeline: dict[str, Any] = {}
        self.notes: list[str] = []
        self.flops_source: str | None = "flops_per_step" if flops_per_step else None
        self._step = 0
        self._running = False
        self._state_lock = threading.Lock()
        self._attachment: Attachment | None = None
        self._guard: FitGuard | None = None
        self._writer: EventWriter | None = None
        self._window = StepStats()
        self._epoch = StepStats()
        self._total = StepStats()
        self._window_t0 = self._epoch_t0 = time.time()
        self._gpu_logger = None
        self._cpu: _CpuMeter | None = None
        self._host: dict[str, float] = {}
        self._flops: float | None = None
        self._peak: float | None = None
        self._jax_specs = None
        self._backend = None
        self._epoch_last_call = -1

    # -- public -------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Training steps seen by this instance, across fit() calls."""
        return self._step

    @property
    def run_dir(self) -> str | None:
        return os.path.join(self.log_dir, self.run_name) if self.log_dir else None

    def summary(self) -> str:
        """A report of the last fit(): verdict, figures, evidence and advice."""
        if self.verdict is None or self.measurement is None:
            return "InputBoundDetector: no training step measured yet."
        return summary_text("InputBoundDetector", self.measurement, self.verdict, self.notes)

    # -- step observer (called by the step hook, on the training thread) ------------------
    def sample(self, index: int) -> bool:
        # Steps 2-4 of the fit, every `sample_every`-th, and the last of each
        # epoch: its sync waits for work the framework dispatched ahead, so
        # the measured step intervals add up to the real wall time.
        return index in (1, 2, 3) or (index > 0 and index % self.sample_every == 0) or index == self._epoch_last_call

    def on_step(self, rec: StepRecord) -> None:
        self._step += rec.steps
        self._window.add(rec)
        self._epoch.add(rec)
        self._total.add(rec)
        if self._jax_specs is None and rec.sampled and not rec.warmup and "jax_args" in rec.extra:
            self._jax_specs = self._shape_specs(rec.extra["jax_args"])
            if self._attachment is not None:
                self._attachment.hook.capture_args = False
        if self._window.steps >= self.window:
            self._close_window()

    def on_detach(self, stale: bool) -> None:
        if stale:
            logger.debug("InputBoundDetector: hook of an earlier fit() removed")

    # -- Keras hooks -----------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._shutdown()
        self._backend = keras.backend.backend()
        self.verdict = None
        self.measurement = None
        self.epoch_verdicts = []
        self.window_verdicts = []
        self.notes = []
        self._total = StepStats()
        self._window = StepStats()
        self._window_t0 = time.time()
        self._jax_specs = None
        self._flops = self.flops_per_step
        self.pipeline = compat.describe_pipeline(self.model)
        self._gpu_logger = self._find_gpu_logger()
        self._peak = self.peak_flops or self._table_peak()
        spe = compat.steps_per_execution(self.model)
        if spe > 1 and self._backend == "tensorflow":
            self.notes.append(
                f"steps_per_execution={spe}: timed per execution of {spe} steps; a synced execution runs its "
                "batches one call each, so its compute includes per-step dispatch the compiled loop avoids."
            )
        try:
            self._attachment = StepHook.attach(self.model, self, backend=self._backend)
            self._attachment.hook.capture_args = self._backend == "jax" and self._flops is None
        except compat.KerasInternalsError as e:
            self.warnings("internals", f"InputBoundDetector is off for this fit(): {e}")
            self._attachment = None
        self._writer = EventWriter(self.run_dir) if self.log_dir else None
        self._running = True
        self._guard = FitGuard(self.model, self._shutdown)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = StepStats()
        self._epoch_t0 = time.time()
        self._cpu = _CpuMeter()
        steps = (self.params or {}).get("steps")
        att = self._attachment
        if steps and att is not None and att.active:
            spe = max(att.hook.steps_per_execution, 1)
            self._epoch_last_call = att.hook.next_index + -(-int(steps) // spe) - 1
        else:
            self._epoch_last_call = -1

    def on_epoch_end(self, epoch, logs=None):
        if not self._running:
            return
        self._flush_hook()
        self._host = self._cpu.read() if self._cpu is not None else {}
        if self._flops is None and self._jax_specs is not None:
            self._flops = self._jax_flops()
        m = self._epoch.measurement(self._flops, self._peak)
        v = self._verdict(m, self._epoch_t0, with_advice=True)
        self.epoch_verdicts.append(v)
        values = m.logs()
        self.epoch_history.append(values)
        if self.epoch_logs and logs is not None:
            logs.update(values)
        self._update_overall()
        if self._writer is not None:
            self._writer.text("input/verdict", summary_text(f"Epoch {epoch + 1}", m, v), step=self._step)
            record = {"scope": f"epoch {epoch + 1}", "verdict": v, "measurement": m, "figures": values}
            self._writer.json("input/verdict/data", record, step=self._step)  # for report()
        if self.verbose:
            print(f"InputBoundDetector epoch {epoch + 1}: {v.message}")

    def on_train_end(self, logs=None):
        if not self._running:
            return
        self._flush_hook()
        self._update_overall()
        if self._window.steps:
            self._close_window()
        if self._writer is not None and self.verdict is not None:
            self._writer.text("input/verdict", self.summary(), step=self._step)
            m = self.measurement
            data = {"scope": "fit", "verdict": self.verdict, "measurement": m, "figures": m.logs(), "notes": self.notes}
            self._writer.json("input/verdict/data", data, step=self._step)  # for report()
        if self.verbose and self.verdict is not None:
            print(self.summary())
        self._shutdown()

    # -- internals -------------------------------------------------------------------------
    def _flush_hook(self) -> None:
        att = self._attachment
        if att is not None and att.active:
            att.hook.flush()

    def _update_overall(self) -> None:
        m = self._total.measurement(self._flops, self._peak)
        self.measurement = m
        self.verdict = self._verdict(m, None, with_advice=True)

    def _verdict(self, m: Measurement, since: float | None, with_advice: bool) -> Verdict:
        return verdict_for(
            m,
            self.moderate_threshold,
            self.high_threshold,
            gpu_means=self._gpu_means(since),
            pipeline=self.pipeline if with_advice else {"kind": "none"},
            host=self._host if with_advice else {},
        )

    def _close_window(self) -> None:
        w, self._window = self._window, StepStats()
        t0, self._window_t0 = self._window_t0, time.time()
        m = w.measurement(self._flops, self._peak)
        if m.wait_fraction is None and m.steps_per_sec is None:
            return
        v = self._verdict(m, t0, with_advice=False)
        v.advice = []
        self.window_verdicts.append((self._step, v))
        if self._writer is not None:
            self._writer.scalars(m.logs(), step=self._step)

    def _find_gpu_logger(self):
        if self.gpu_logger is None:
            return None
        if self.gpu_logger != "auto":
            return self.gpu_logger
        try:
            from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
        except Exception:
            return None
        for cb in compat.find_callback_list(self.model):
            if isinstance(cb, GPUUtilizationLogger):
                return cb
        return None

    def _gpu_means(self, since: float | None) -> dict[str, float]:
        lg = self._gpu_logger
        if lg is None:
            return {}
        try:
            points = list(lg.timeline)
        except Exception:
            return {}
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for wall, _step, means in points:
            if since is not None and wall < since:
                continue
            for k, v in means.items():
                if k.startswith("gpu/"):
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        return {k: sums[k] / counts[k] for k in sums}

    def _table_peak(self) -> float | None:
        try:
            if not backends.for_backend(self._backend).gpu_devices():
                return None
            from keras_gpu_tools._core.devices import visible_gpus
            from keras_gpu_tools._core.nvml import default_nvml

            gpus = visible_gpus(default_nvml())
            if not gpus:
                return None
            dtype = gpu_peaks.matmul_dtype(self.model.dtype_policy.compute_dtype, self._backend)
            peak = gpu_peaks.peak_flops(gpus[0].name, dtype)
            if peak is None:
                self.warnings(
                    ("peak", gpus[0].name, dtype),
                    f"InputBoundDetector: no peak FLOP/s known for {gpus[0].name} in {dtype}; MFU is left out (pass `peak_flops=` to set it).",
                )
            return peak
        except Exception:
            return None

    def _shape_specs(self, args):
        try:
            import jax

            def spec(a):
                return jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") and hasattr(a, "dtype") else a

            return jax.tree_util.tree_map(spec, args)
        except Exception:
            return None

    def _jax_flops(self) -> float | None:
        att = self._attachment
        if att is None or self._jax_specs is None:
            return None
        try:
            step = compat.jax_step_function(att.hook.original)
            if step is None:
                return None
            # XLA's HLO cost analysis of the un-optimised step, lowered for
            # the CPU platform (a GPU-compiled program hides its matmuls in
            # cuBLAS custom calls, which count 0). Where this JAX has no
            # lowered cost analysis, the matmuls and convolutions of the
            # step's jaxpr are counted instead.
            flops = None
            try:
                flops = _flops_of(step.trace(*self._jax_specs).lower(lowering_platforms=("cpu",)).cost_analysis())
            except Exception:
                flops = None
            if flops:
                self.flops_source = "XLA cost analysis"
            else:
                import jax

                flops = gpu_peaks.jaxpr_flops(jax.make_jaxpr(step)(*self._jax_specs)) or None
                self.flops_source = "matmul/convolution FLOPs of the step's jaxpr"
            if not flops:
                self.warnings(
                    "flops",
                    "InputBoundDetector: XLA's cost analysis reported no FLOP count; FLOP/s and MFU are left out.",
                )
            return flops
        except Exception as e:
            self.warnings(
                "flops",
                f"InputBoundDetector: XLA cost analysis failed ({type(e).__name__}: {e}); FLOP/s and MFU are left out.",
            )
            return None
        finally:
            self._jax_specs = None  # one attempt per fit()

    def _shutdown(self) -> None:
        """Removes the hook and closes the writer; safe to call twice, from any thread."""
        with self._state_lock:
            if not self._running:
                return
            self._running = False
            guard, self._guard = self._guard, None
            att, self._attachment = self._attachment, None
        if guard is not None:
            guard.close()
        if att is not None:
            att.detach()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __repr__(self) -> str:
        cat = self.verdict.category if self.verdict else UNKNOWN
        return f"InputBoundDetector(window={self.window}, sample_every={self.sample_every}, verdict={cat!r})"
