"""Reading GPU, allocator and host metrics, and aggregating them.

Nothing here knows about Keras. :class:`MetricSampler` reads one sample (a flat
``{key: float}`` dict); :class:`~keras_gpu_tools.telemetry.aggregate.Aggregate` folds them into means and maxima.
The fit session's thread (:mod:`keras_gpu_tools.runtime.ticker`) runs the
sampling. A field a GPU cannot report is warned about once, left out, and
never asked for again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.runtime.warn_once import WarnOnce
from keras_gpu_tools.telemetry import health
from keras_gpu_tools.telemetry.aggregate import Aggregate, field_of
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS, SUM_FIELDS
from keras_gpu_tools.telemetry.nvml import NA, NVML, GPUInfo, NVMLQueryError

logger = logging.getLogger("keras_gpu_tools")

MIB = 1024.0 * 1024.0
# Seconds the first sample of a fit waits after priming GPM and the CPU
# counters, so that it carries every key those can report.
FIRST_SPAN = 0.1


# ---------------------------------------------------------------------------
# GPU fields. Each reader returns a float, or NA when the device cannot say.
# ---------------------------------------------------------------------------
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
GPM_METRICS = {  # NVML_GPM_METRIC_* id -> key
    2: "sm_activity_percent",  # SM_UTIL: fraction of SMs busy
    3: "sm_occupancy_percent",  # SM_OCCUPANCY: resident warps vs maximum
    5: "tensor_activity_percent",  # ANY_TENSOR_UTIL: tensor pipes busy
}

# key -> (doc, unit). Also the documentation table of the callback.
GPU_FIELDS: dict[str, str] = {
    "utilization_percent": "time a kernel was running (NVML's coarse utilization), %",
    "memory_busy_percent": "time device memory was read or written, %",
    "memory_used_mib": "device memory in use by all processes, MiB",
    "memory_total_mib": "device memory, MiB",
    "power_watts": "power draw, W",
    "power_limit_watts": "enforced power limit, W",
    "temperature_celsius": "GPU temperature, deg C",
    "sm_clock_mhz": "SM clock, MHz",
    "pcie_tx_mib_per_sec": "PCIe transmit throughput, MiB/s",
    "pcie_rx_mib_per_sec": "PCIe receive throughput, MiB/s",
    "sm_activity_percent": "SMs busy (GPM, Hopper and later), %",
    "sm_occupancy_percent": "warps resident vs maximum (GPM), %",
    "tensor_activity_percent": "tensor pipes busy (GPM), %",
    "allocator_memory_mib": "memory held by the framework's allocator now, MiB",
    "allocator_peak_memory_mib": "peak of the framework's allocator, MiB",
    **HEALTH_FIELDS,
}
HOST_FIELDS: dict[str, str] = {
    "cpu_percent": "this process's CPU use, % of one core (can exceed 100)",
    "system_cpu_percent": "whole machine's CPU use, % of all cores",
    "rss_mib": "this process's resident memory, MiB",
}
# Fields read at most once a SLOW_PERIOD seconds, whatever the interval. The total-energy counter costs
# milliseconds of CPU a reading (NVML's other calls microseconds) and PCIe throughput blocks for its
# window: read every tick they would take a few % of a core; an epoch's end takes the energy since the
# last reading from the power (health.Energy.split). Utilization and power are NVML's averages over a
# window of its own (up to a second); ECC counts and the power limit rarely change. The other fields
# (clock-event reasons, clocks, memory) are read every tick.
SLOW_FIELDS = frozenset(
    {"utilization_percent", "power_watts", "power_limit_watts", "pcie_tx_mib_per_sec", "pcie_rx_mib_per_sec"}
    | {"ecc_corrected_errors", "ecc_uncorrected_errors", "energy_joules"}
)
SLOW_PERIOD = 1.0
# Of those, the two that cost most (the energy counter: milliseconds of CPU; PCIe: most of a millisecond
# each way) are read every COSTLY_FACTOR slow periods.
COSTLY_FIELDS = frozenset({"energy_joules", "pcie_tx_mib_per_sec", "pcie_rx_mib_per_sec"})
COSTLY_FACTOR = 2.0
# GPM's figures are rates between two of its samples (a fifth of a millisecond of CPU each), so
# sampling it every GPM_PERIOD still averages over the whole span.
GPM_PERIOD = 0.5


def _simple_readers(nvml: NVML, pcie: bool) -> list[tuple[tuple[str, ...], Callable]]:
    """(keys, reader(handle, on_unsupported) -> tuple of values)."""

    def utilization(h, u):
        r = nvml.query("nvmlDeviceGetUtilizationRates", h, on_unsupported=u)
        return (NA, NA) if r is NA else (float(r.gpu), float(r.memory))

    def memory(h, u):
        r = nvml.query("nvmlDeviceGetMemoryInfo", h, on_unsupported=u)
        return (NA, NA) if r is NA else (r.used / MIB, r.total / MIB)

    def scaled(func, *args, scale=1.0):
        def read(h, u):
            r = nvml.query(func, h, *args, on_unsupported=u)
            return (NA,) if r is NA else (float(r) * scale,)

        return read

    readers = [
        (("utilization_percent", "memory_busy_percent"), utilization),
        (("memory_used_mib", "memory_total_mib"), memory),
        (("power_watts",), scaled("nvmlDeviceGetPowerUsage", scale=1e-3)),
        (("power_limit_watts",), scaled("nvmlDeviceGetEnforcedPowerLimit", scale=1e-3)),
        (("temperature_celsius",), scaled("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)),
        (("sm_clock_mhz",), scaled("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)),
    ]
    if pcie:  # each call blocks ~20 ms for its sampling window: thread only
        kb = 1024.0 / MIB
        readers += [
            (("pcie_tx_mib_per_sec",), scaled("nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_TX_BYTES, scale=kb)),
            (("pcie_rx_mib_per_sec",), scaled("nvmlDeviceGetPcieThroughput", NVML_PCIE_UTIL_RX_BYTES, scale=kb)),
        ]
    return readers


class _GPM:
    """SM activity, occupancy, tensor activity, DRAM bandwidth and NVLink throughput from NVML's GPM (Hopper+).

    A metric is the rate between two GPM samples; the previous tick's sample is
    kept, so each tick costs one sample and one metrics call. NVLink is read
    only where the GPU has an active link; a metric GPM cannot report goes to
    ``failed`` with its reason and is not asked for again.
    """

    KEYS = (*GPM_METRICS.values(), *health.GPM_DRAM_METRICS.values(), *health.GPM_NVLINK_METRICS.values())

    def __init__(self, nvml: NVML, gpu: GPUInfo):
        self.nvml = nvml
        self.gpu = gpu
        self.prev = None
        self.supported: bool | None = None  # unknown until first tick
        self.reason = ""
        self.metrics: dict[int, str] = {**GPM_METRICS, **health.GPM_DRAM_METRICS}
        self.failed: dict[str, str] = {}  # key -> why GPM cannot report it
        self._parent = None
        self._gi = None

    def _sample(self):
        m = self.nvml.module
        s = m.nvmlGpmSampleAlloc()
        try:
            if self.gpu.is_mig:
                m.nvmlGpmMigSampleGet(self._parent, self._gi, s)
            else:
                m.nvmlGpmSampleGet(self.gpu.handle, s)
        except Exception:
            m.nvmlGpmSampleFree(s)
            raise
        return s

    def _check_support(self) -> bool:
        m = self.nvml.module
        if not hasattr(m, "nvmlGpmQueryDeviceSupport"):
            self.reason = "this nvidia-ml-py has no GPM functions"
            return False
        handle = self.gpu.handle
        if self.gpu.is_mig:
            self._parent = self.nvml.query("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            self._gi = self.nvml.query("nvmlDeviceGetGpuInstanceId", handle)
            if self._parent is NA or self._gi is NA:
                self.reason = "the MIG instance's parent GPU could not be found"
                return False
            handle = self._parent
        try:
            support = m.nvmlGpmQueryDeviceSupport(handle)
        except m.NVMLError as e:
            self.reason = f"GPM query failed ({type(e).__name__})"
            return False
        if not getattr(support, "isSupportedDevice", 0):
            self.reason = "GPM is not supported on this GPU (it needs Hopper or later)"
            return False
        links, why = (
            (0, "NVLink throughput is not read per MIG instance")
            if self.gpu.is_mig
            else health.nvlink_links(self.nvml, handle)
        )
        if links:
            self.metrics.update(health.GPM_NVLINK_METRICS)
        else:
            self.failed.update(dict.fromkeys(health.GPM_NVLINK_METRICS.values(), why))
        return True

    def prime(self) -> bool:
        """Takes the first sample now, so that the next read has rates; True if it did."""
        if self.supported is None:
            self.supported = self._check_support()
        if not self.supported or self.prev is not None:
            return False
        self.prev = self._sample()
        return True

    def read(self) -> dict[str, float]:
        if self.supported is None:
            self.supported = self._check_support()
        if not self.supported:
            return {}
        m = self.nvml.module
        cur = self._sample()
        prev, self.prev = self.prev, cur
        if prev is None:
            return {}
        try:
            mg = m.c_nvmlGpmMetricsGet_t()
            mg.version = m.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self.metrics)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, metric_id in enumerate(self.metrics):
                mg.metrics[i].metricId = metric_id
            m.nvmlGpmMetricsGet(mg)
            out = {}
            for i, (metric_id, key) in enumerate(list(self.metrics.items())):
                code = mg.metrics[i].nvmlReturn
                if code == 0:
                    out[key] = float(mg.metrics[i].value)
                else:
                    self.failed[key] = f"GPM cannot report it on this GPU (NVML error {code})"
                    del self.metrics[metric_id]
            return out
        finally:
            m.nvmlGpmSampleFree(prev)

    def close(self):
        if self.prev is not None:
            try:
                self.nvml.module.nvmlGpmSampleFree(self.prev)
            except Exception:
                pass
            self.prev = None


class GPUProbe:
    """Reads one GPU's metrics under the key prefix ``gpu/<label>/``.

    ``index`` is the framework's (``GPU:<index>``); ``label`` names the GPU in
    the keys, unambiguous across a job of several processes (defaults to the
    index: one process).
    """

    def __init__(
        self,
        nvml: NVML,
        index: int,
        gpu: GPUInfo,
        warn: WarnOnce,
        pcie: bool = True,
        gpm: bool = True,
        label: str | None = None,
    ):
        self.nvml = nvml
        self.index = index
        self.gpu = gpu
        self.warn = warn
        self.label = str(index) if label is None else label
        self.prefix = schema.gpu_key(self.label, "")
        self.readers = _simple_readers(nvml, pcie) + health.health_readers(nvml)
        self.gpm = _GPM(nvml, gpu) if gpm else None
        self.lost = False
        self._failures: dict[tuple[str, ...], int] = {}
        self.unsupported: dict[str, str] = {}  # field -> why this GPU or driver does not report it
        self.clock = time.monotonic
        self.energy = next((r for k, r in self.readers if isinstance(r, health.Energy)), None)
        self._gpm_at = -math.inf
        self._slow_read = {k: -math.inf for k, _ in self.readers if SLOW_FIELDS.intersection(k)}  # keys -> last read

    def _drop(self, keys: tuple[str, ...], reason: str) -> None:
        self.readers = [(k, r) for k, r in self.readers if k != keys]
        self.unsupported.update(dict.fromkeys(keys, reason))
        self.warn(
            (self.index, keys),
            f"GPU {self.index} ({self.gpu.name}): {', '.join(keys)} not available "
            f"({reason}); left out of the logs from now on.",
        )

    def prime(self) -> bool:
        """Takes GPM's first sample now (see :meth:`MetricSampler.sample`); True if it did."""
        for _, reader in self.readers if not self.lost else ():
            prime = getattr(reader, "prime", None)  # a counter's first reading (energy)
            if prime is not None:
                try:
                    prime(self.gpu.handle)
                except Exception:  # read() says what is wrong with it
                    pass
        if self.gpm is None or self.lost:
            return False
        try:
            return self.gpm.prime()
        except Exception as e:  # read() warns and drops GPM
            self.gpm.close()
            self.gpm.supported = False
            self.gpm.reason = str(e)
            return False

    def read(self) -> dict[str, float]:
        if self.lost:
            return {}
        out: dict[str, float] = {}
        now = self.clock()
        for keys, reader in list(self.readers):
            last = self._slow_read.get(keys)
            if last is not None:
                if now - last < SLOW_PERIOD * (COSTLY_FACTOR if COSTLY_FIELDS.intersection(keys) else 1.0):
                    # A mean is over the samples that carry it; a count (energy) is 0 until the next reading.
                    out.update({self.prefix + k: 0.0 for k in keys if k in SUM_FIELDS})
                    continue
                self._slow_read[keys] = now
            unsupported: list[str] = []
            try:
                values = reader(self.gpu.handle, unsupported.append)
            except NVMLQueryError as e:
                if e.lost:
                    self.lost = True
                    self.warn(
                        (self.index, "lost"),
                        f"GPU {self.index} ({self.gpu.name}) fell off the bus: {e}. Its metrics stop here.",
                    )
                    return out
                # Transient errors are tolerated; three in a row drop the field.
                n = self._failures[keys] = self._failures.get(keys, 0) + 1
                if n >= 3:
                    self._drop(keys, str(e))
                continue
            self._failures.pop(keys, None)
            if unsupported:
                self._drop(keys, unsupported[0])
                continue
            for key, value in zip(keys, values):
                if value is not NA:
                    out[self.prefix + key] = value
        if self.gpm is not None and now - self._gpm_at >= GPM_PERIOD:
            self._gpm_at = now
            try:
                gpm_values = self.gpm.read()
            except Exception as e:  # a GPM failure costs GPM only
                self.gpm.close()
                self.gpm.supported = False
                self.gpm.reason = str(e)
                gpm_values = {}
            for key, reason in self.gpm.failed.items():
                if key not in self.unsupported:
                    self.unsupported[key] = reason
                    self.warn((self.index, key), f"GPU {self.index} ({self.gpu.name}): {key} not available ({reason}).")
            if self.gpm.supported is False:
                self.warn(
                    (self.index, "gpm"),
                    f"GPU {self.index} ({self.gpu.name}): SM activity, SM occupancy, tensor activity, DRAM bandwidth "
                    f"and NVLink throughput not available ({self.gpm.reason}).",
                )
                for key in self.gpm.KEYS:
                    self.unsupported.setdefault(key, self.gpm.reason)
                self.gpm = None
            for key, value in gpm_values.items():
                out[self.prefix + key] = value
        return out

    def close(self):
        if self.gpm is not None:
            self.gpm.close()


class HostProbe:
    """This process's CPU and memory, and the machine's CPU (psutil)."""

    def __init__(self, warn: WarnOnce, clock: Callable[[], float] = time.monotonic):
        self.warn = warn
        self.clock = clock
        try:
            import psutil
        except ImportError:
            self.process = None
            warn("psutil", "psutil is not installed: host/* metrics are left out (pip install psutil).")
            return
        self.psutil = psutil
        self.process = psutil.Process()
        # cpu_percent measures since the previous call: prime both counters.
        self.process.cpu_percent(None)
        psutil.cpu_percent(None)
        self._cpu_since = clock()
        self._complete_at: float | None = None  # the last read with CPU use in it

    # Over a shorter span cpu_percent is mostly rounding noise (a sample right
    # after priming can read several times the machine's capacity).
    MIN_CPU_SPAN = FIRST_SPAN

    # Reading /proc costs about half a millisecond of CPU: after the first read with CPU use in it,
    # at most one a second (a sample in between carries none; the epoch's figures carry the last).
    PERIOD = SLOW_PERIOD

    def read(self) -> dict[str, float]:
        if self.process is None:
            return {}
        now = self.clock()
        if self._complete_at is not None and now - self._complete_at < self.PERIOD:
            return {}
        try:
            out = {schema.HOST_RSS_MIB: self.process.memory_info().rss / MIB}
            if now - self._cpu_since >= self.MIN_CPU_SPAN:
                out[schema.HOST_CPU_PERCENT] = float(self.process.cpu_percent(None))
                out[schema.HOST_SYSTEM_CPU_PERCENT] = float(self.psutil.cpu_percent(None))
                self._cpu_since = self._complete_at = now
            return out
        except Exception as e:
            self.warn("host", f"host metrics could not be read ({e}); left out from now on.")
            self.process = None
            return {}


class MetricSampler:
    """Takes one sample of everything: GPUs, the framework's allocator, host."""

    def __init__(
        self,
        gpu_probes: Sequence[GPUProbe],
        host: HostProbe | None,
        allocator: Callable[[Iterable[int]], dict[int, tuple[float, float]]] | None = None,
        warn: WarnOnce | None = None,
        events: health.XidWatcher | None = None,
    ):
        self.gpu_probes = list(gpu_probes)
        self.host = host
        self.allocator = allocator
        self.warn = warn or WarnOnce()
        self.events = events  # the GPUs' XID events (its event set made at the first sample)
        # The keys of the first sample, in order: the epoch logs' keys for this
        # sampler's life (one fit), so every epoch has the same columns.
        self.keys: tuple[str, ...] | None = None
        self.latest: dict[str, float] = {}  # the last value of every key
        self._counts: tuple[str, ...] = ()  # the keys of counts per sample (energy, XID events)
        self._lock = threading.Lock()

    def unsupported(self) -> dict[str, dict[str, str]]:
        """GPU label -> field -> why the GPU or driver does not report it (so far)."""
        return {p.label: dict(p.unsupported) for p in self.gpu_probes}

    def _prime(self) -> None:
        """Makes the first sample complete: GPM rates and CPU use need a span to measure over."""
        deadline = 0.0
        if self.events is not None:
            self.events.start()
        for probe in self.gpu_probes:
            if probe.prime():
                deadline = max(deadline, time.monotonic() + FIRST_SPAN)
        host = self.host
        if host is not None and host.process is not None:
            deadline = max(deadline, host._cpu_since + FIRST_SPAN)
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # once per fit, on the fit session's thread

    def sample(self) -> dict[str, float]:
        if self.keys is None:
            self._prime()
        out = self._read()
        with self._lock:
            self.latest.update(out)
            if self.keys is None:
                self.keys = tuple(out)
                self._counts = tuple(k for k in out if field_of(k) in SUM_FIELDS)
            for key in self._counts:
                if key not in out:  # a count that stopped reporting: not measured (NaN), never 0
                    self.latest[key] = math.nan
        return out

    def epoch_summary(self, agg: Aggregate) -> dict[str, float]:
        """The epoch logs from ``agg``: exactly this fit's keys, a stale value rather than none.

        A key the epoch has no sample of (an epoch shorter than the interval,
        a CPU span under 0.1 s, a field that stopped reporting) carries its
        latest value. Before the first sample: whatever ``agg`` has (nothing).
        """
        with self._lock:
            keys, latest = self.keys, dict(self.latest)
        if keys is None:
            return agg.summary()
        return agg.summary(keys=keys, latest=latest)

    def end_epoch(self, agg: Aggregate) -> dict[str, float]:
        """`epoch_summary` of the epoch ending now, its energy including the joules since the last reading."""
        values = self.epoch_summary(agg)
        for key, joules in self.energy_tails().items():
            if key in values and math.isfinite(values[key]):
                values[key] += joules
        return values

    def energy_tails(self) -> dict[str, float]:
        """``gpu/<label>/energy_joules`` -> the joules since each GPU's last energy reading, from its power.

        For the epoch ending now (the next reading leaves them out): see `SLOW_FIELDS`.
        """
        out = {}
        with self._lock:
            latest = dict(self.latest)
        for probe in self.gpu_probes:
            if probe.energy is not None and "energy_joules" not in probe.unsupported:
                out[probe.prefix + "energy_joules"] = probe.energy.split(latest.get(probe.prefix + "power_watts"))
        return out

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for probe in self.gpu_probes:
            out.update(probe.read())
        if self.allocator is not None:
            try:
                stats = self.allocator([p.index for p in self.gpu_probes])
            except Exception as e:
                self.warn(
                    "allocator", f"the framework's allocator statistics could not be read ({e}); left out from now on."
                )
                self.allocator = None
                stats = {}
            labels = {p.index: p.label for p in self.gpu_probes}
            for index, (current, peak) in stats.items():
                label = labels.get(index, str(index))
                out[schema.gpu_key(label, "allocator_memory_mib")] = current / MIB
                out[schema.gpu_key(label, "allocator_peak_memory_mib")] = peak / MIB
        if self.events is not None:
            out.update(self.events.poll())
        if self.host is not None:
            out.update(self.host.read())
        return out

    def close(self):
        if self.events is not None:
            self.events.close()
        for probe in self.gpu_probes:
            probe.close()
