"""The GPU health fields: their keys, what each means, and NVML's clock-event reason bits.

The logger's sampler writes them as ``gpu/<label>/<field>`` (per epoch); the straggler verdict,
`doctor` and the report read them by these names. A field a GPU or driver cannot report is absent
from the logs, with the reason in ``doctor`` and the report, never zero.
"""

from __future__ import annotations

from typing import Protocol

# Clock-event ("throttle") reasons: the share of the epoch's samples in which each was active, %.
# NVML's bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*) grouped as users name them.
THROTTLE_REASONS: dict[str, int] = {
    "throttle_power_percent": 0x4,  # SwPowerCap: the power limit holds the clocks down
    "throttle_thermal_percent": 0x20 | 0x40,  # SwThermalSlowdown | HwThermalSlowdown
    "throttle_hw_slowdown_percent": 0x8 | 0x80,  # HwSlowdown | HwPowerBrakeSlowdown
    "throttle_sync_boost_percent": 0x10,  # SyncBoost: held to the slowest GPU of a sync-boost group
    "throttle_app_clocks_percent": 0x2,  # ApplicationsClocksSetting: clocks capped by application clocks
}

# key -> description with unit (the logger's key table and doctor's list read these).
HEALTH_FIELDS: dict[str, str] = {
    **{
        key: f"share of the epoch's samples with the {what} clock-event reason active, %"
        for key, what in (
            ("throttle_power_percent", "power cap"),
            ("throttle_thermal_percent", "thermal slowdown (software or hardware)"),
            ("throttle_hw_slowdown_percent", "hardware slowdown (incl. power brake)"),
            ("throttle_sync_boost_percent", "sync boost"),
            ("throttle_app_clocks_percent", "application clocks setting"),
        )
    },
    "sm_clock_max_mhz": "the SM clock's maximum, MHz",
    "memory_clock_mhz": "memory clock, MHz",
    "memory_clock_max_mhz": "the memory clock's maximum, MHz",
    "energy_joules": "energy used in the epoch (NVML's total-energy counter), J",
    "dram_bandwidth_percent": "DRAM bandwidth used vs peak (GPM, Hopper and later), %",
    "nvlink_rx_mib_per_sec": "NVLink receive throughput, all links (GPM), MiB/s",
    "nvlink_tx_mib_per_sec": "NVLink transmit throughput, all links (GPM), MiB/s",
    "ecc_corrected_errors": "corrected ECC errors since the driver loaded (volatile count)",
    "ecc_uncorrected_errors": "uncorrected ECC errors since the driver loaded (volatile count)",
    "xid_events": "XID error events seen in the epoch (each also warned about, naming the GPU)",
}

# FitSession.shared key under which the logger publishes a GPUHealthSource (the straggler verdict and
# others in the same process read the last epoch's GPU figures through it, whatever the callback order).
SHARED_GPU_HEALTH = "gpu_health"


class GPUHealthSource(Protocol):
    """What the logger publishes under ``FitSession.shared[SHARED_GPU_HEALTH]`` for the fit's other callbacks.

    Both methods are cheap (no NVML call): they return what the logger's sampling already holds.
    """

    def last_epoch(self) -> dict[str, dict[str, float]]:
        """GPU label -> field -> the last completed epoch's value, for every GPU field (health and the others)."""
        ...

    def unsupported(self) -> dict[str, dict[str, str]]:
        """GPU label -> field -> why the GPU or driver cannot report it."""
        ...
