"""A fake ``pynvml`` for machines without a GPU.

It implements the subset of nvidia-ml-py that keras_gpu_tools calls, with the
same names, argument order, units and error type (``NVMLError`` with a
``value`` code), and records every call with the thread it came from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {
            3: "Not Supported",
            6: "Not Found",
            10: "Timeout",
            12: "NVML Shared Library Not Found",
            15: "GPU is lost",
        }.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 80 * 1024**3
    memory_used: int = 1024**3
    compute_capability: tuple = (9, 0)
    utilization: int = 87
    memory_busy: int = 40
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    temperature: int = 61
    sm_clock: int = 1980
    pcie_tx_kb: int = 2048
    pcie_rx_kb: int = 4096
    mem_clock: int = 2619
    sm_clock_max: int = 1980
    mem_clock_max: int = 2619
    clock_reasons: int = 0  # nvmlClocksEventReason* bits active now
    # NVML's total-energy counter (mJ): ``energy_mj`` when set, else ``energy_base_mj`` plus what
    # ``power_mw`` has used since the fake GPU was made (mW x s = mJ, by ``clock``), like the driver's counter.
    energy_mj: int | None = None
    energy_base_mj: int = 5_000_000
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    nvlink_links: int = 18  # active NVLink links; 0: the GPU has no NVLink (NotSupported)
    xid_pending: list[int] = field(default_factory=list)  # XID codes the next event-set waits return
    gpm: bool = True
    gpm_values: dict[int, float] = field(
        default_factory=lambda: {2: 91.5, 3: 45.25, 5: 60.0, 10: 35.5, 60: 1024.0, 61: 2048.0}
    )
    # pynvml function names that say NotSupported; "name:arg" for one value of the first argument after
    # the handle ("nvmlDeviceGetClockInfo:2": the memory clock; "nvmlDeviceGetTotalEccErrors:1": uncorrected)
    unsupported: set = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)  # function -> error code, raised every call
    mig: list[FakeGPU] = field(default_factory=list)
    gpu_instance_id: int | None = None
    parent: FakeGPU | None = None
    delay: float = 0.0  # seconds each utilization query blocks, like PCIe throughput does
    # The energy counter's clock: a test passes a fake one to make the joules exact.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    made_at: float | None = None  # when the counter started (``clock()`` at construction when None)

    def __post_init__(self):
        if self.made_at is None:
            self.made_at = self.clock()


class _Metric:
    def __init__(self):
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self):
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [_Metric() for _ in range(16)]


class FakeNVML:
    """Use as the ``module`` of :class:`keras_gpu_tools.telemetry.nvml.NVML`."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpus=None, init_error: int | None = None, driver="580.159.04", missing=()):
        self.gpus: list[FakeGPU] = list(gpus if gpus is not None else [FakeGPU()])
        for g in self.gpus:
            for j, m in enumerate(g.mig):
                m.parent = g
                m.gpu_instance_id = j + 1
        self.init_error = init_error
        self.driver = driver
        self.calls: list[tuple] = []  # (function name, thread ident)
        self._lock = threading.Lock()
        self.live_gpm_samples = 0
        self.event_sets: list[SimpleNamespace] = []
        # Functions these bindings lack (an older nvidia-ml-py): getattr raises AttributeError.
        self.missing = set(missing)

    def __getattribute__(self, name):
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    @property
    def live_event_sets(self) -> int:
        return sum(1 for s in self.event_sets if not s.freed)

    # bookkeeping
    def _call(self, name, gpu: FakeGPU | None = None, arg=None):
        with self._lock:
            self.calls.append((name, threading.get_ident()))
        if gpu is not None:
            if name in gpu.unsupported or f"{name}:{arg}" in gpu.unsupported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            if name in gpu.failing:
                raise NVMLError(gpu.failing[name])

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)

    # life cycle
    def nvmlInit(self):
        self._call("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self):
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        self._call("nvmlSystemGetCudaDriverVersion")
        return 13000

    # enumeration
    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self.gpus):
            raise NVMLError(2)
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        self._call("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetName(self, h):
        self._call("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetCudaComputeCapability(self, h):
        self._call("nvmlDeviceGetCudaComputeCapability", h)
        return h.compute_capability

    def nvmlDeviceGetMigMode(self, h):
        self._call("nvmlDeviceGetMigMode", h)
        return (1, 1) if h.mig else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        self._call("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if j >= len(h.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return h.mig[j]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h)
        return h.parent

    def nvmlDeviceGetGpuInstanceId(self, h):
        self._call("nvmlDeviceGetGpuInstanceId", h)
        return h.gpu_instance_id

    # metrics
    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates", h)
        if h.delay:
            time.sleep(h.delay)
        return SimpleNamespace(gpu=h.utilization, memory=h.memory_busy)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        self._call("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=h.memory_total, used=h.memory_used, free=h.memory_total - h.memory_used)

    def nvmlDeviceGetPowerUsage(self, h):
        self._call("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._call("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.power_limit_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._call("nvmlDeviceGetTemperature", h)
        return h.temperature

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._call("nvmlDeviceGetClockInfo", h, clock)
        return h.mem_clock if clock == 2 else h.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        self._call("nvmlDeviceGetMaxClockInfo", h, clock)
        return h.mem_clock_max if clock == 2 else h.sm_clock_max

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.clock_reasons

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._call("nvmlDeviceGetTotalEnergyConsumption", h)
        if h.energy_mj is not None:
            return h.energy_mj
        return h.energy_base_mj + int(h.power_mw * (h.clock() - h.made_at))

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        self._call("nvmlDeviceGetTotalEccErrors", h, error_type)
        return h.ecc_uncorrected if error_type == 1 else h.ecc_corrected

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._call("nvmlDeviceGetNvLinkState", h)
        if not h.nvlink_links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= h.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return 1

    # events
    def nvmlEventSetCreate(self):
        self._call("nvmlEventSetCreate")
        event_set = SimpleNamespace(gpus=[], freed=False)
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        self._call("nvmlDeviceRegisterEvents", h)
        event_set.gpus.append(h)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self._call("nvmlEventSetWait_v2")
        assert not event_set.freed, "an event set used after it was freed"
        for h in event_set.gpus:
            if h.xid_pending:
                code = h.xid_pending.pop(0)
                return SimpleNamespace(
                    device=h, eventType=0x8, eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
                )
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        self._call("nvmlEventSetFree")
        event_set.freed = True

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._call("nvmlDeviceGetPcieThroughput", h)
        return h.pcie_tx_kb if counter == 0 else h.pcie_rx_kb

    # GPM
    def nvmlGpmQueryDeviceSupport(self, h):
        self._call("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=1 if h.gpm else 0)

    def nvmlGpmSampleAlloc(self):
        self._call("nvmlGpmSampleAlloc")
        self.live_gpm_samples += 1
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleFree(self, s):
        self._call("nvmlGpmSampleFree")
        self.live_gpm_samples -= 1

    def nvmlGpmSampleGet(self, h, s):
        self._call("nvmlGpmSampleGet", h)
        s.gpu = h

    def nvmlGpmMigSampleGet(self, h, gi, s):
        self._call("nvmlGpmMigSampleGet", h)
        s.gpu = next(m for m in h.mig if m.gpu_instance_id == gi)

    def nvmlGpmMetricsGet(self, mg):
        self._call("nvmlGpmMetricsGet")
        gpu = mg.sample2.gpu
        for i in range(mg.numMetrics):
            metric = mg.metrics[i]
            if metric.metricId in gpu.gpm_values:
                metric.value = gpu.gpm_values[metric.metricId]
                metric.nvmlReturn = 0
            else:
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return mg
