"""GPUUtilizationLogger's health figures on a real GPU, against nvidia-smi sampled at 10 Hz in another process.

KERAS_BACKEND=jax python -m pytest -m gpu -s tests/callbacks/test_gpu_utilization_logger_health_gpu.py
KERAS_BACKEND=torch python -m pytest -m gpu -s tests/callbacks/test_gpu_utilization_logger_health_gpu.py

A fit of about 25 s of matmul load (3 epochs; its length is sized from a timed fit, never asserted) with the
logger at its default interval. Each epoch's
`energy_joules` must be within 5% of the integral of nvidia-smi's power readings over the epoch's
wall interval, and each `throttle_*_percent` within 5 points of the share of nvidia-smi's samples
with that reason's bits set (over the epochs after the first, which holds the fit's start).
"""

import datetime
import json
import math
import os
import shutil
import subprocess
import time

import keras
import numpy as np
import pytest

from keras_gpu_tools import GPUUtilizationLogger
from keras_gpu_tools.telemetry.health_fields import THROTTLE_REASONS

pytestmark = pytest.mark.gpu

LOAD_SECONDS = 25.0
EPOCHS = 3


class SameBatch(keras.utils.PyDataset):
    """`steps` copies of one batch: a heavy matmul loop without gigabytes of host data."""

    def __init__(self, x, steps):
        super().__init__()
        self.x, self.steps = x, steps

    def __len__(self):
        return self.steps

    def __getitem__(self, i):
        return self.x, self.x


class EpochSpans(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.spans = []

    def on_epoch_begin(self, epoch, logs=None):
        self.spans.append([time.time(), None])

    def on_epoch_end(self, epoch, logs=None):
        self.spans[-1][1] = time.time()


def smi_fields():
    """nvidia-smi's names for the power reading and the clock-event reasons (older drivers: throttle)."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    helptext = subprocess.run(["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True, timeout=30).stdout
    reasons = (
        "clocks_event_reasons.active" if "clocks_event_reasons.active" in helptext else "clocks_throttle_reasons.active"
    )
    # The reference is nvidia-smi's one-second average power (power.draw.average; power.draw on drivers
    # without it): instant readings taken every 100 ms alias with a workload whose steps take a multiple
    # of that (a 200 ms step gave integrals 6% off the energy counter in one epoch). The instant reading's
    # integral is reported beside it.
    power = "power.draw.average" if "power.draw.average" in helptext else "power.draw"
    instant = "power.draw.instant" if "power.draw.instant" in helptext else power
    return power, instant, reasons


def parse_smi(lines):
    """(unix time, watts, reason bits, instant watts) of each line of `timestamp, power, instant power, reasons`."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time
            out.append((stamp, float(parts[1]), int(parts[3], 16), float(parts[2])))
        except ValueError:  # "[N/A]", a header, a cut line
            continue
    return out


def integral(samples, t0, t1, column=1):
    """Joules: the trapezoid integral of the power readings over [t0, t1], interpolated at both ends."""
    ts = np.array([s[0] for s in samples])
    ws = np.array([s[column] for s in samples])
    inside = (ts > t0) & (ts < t1)
    grid = np.concatenate([[t0], ts[inside], [t1]])
    watts = np.interp(grid, ts, ws)
    return float(np.sum(np.diff(grid) * (watts[1:] + watts[:-1]) / 2))


def heavy_model(width=8192, depth=4, features=64):
    model = keras.Sequential(
        [keras.Input((features,))] + [keras.layers.Dense(width) for _ in range(depth)] + [keras.layers.Dense(features)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_energy_and_throttle_shares_agree_with_nvidia_smi(tmp_path):
    from keras_gpu_tools.telemetry.devices import visible_gpus
    from keras_gpu_tools.telemetry.nvml import default_nvml

    power_field, instant_field, reasons_field = smi_fields()
    gpu = visible_gpus(default_nvml())[0]
    x = np.random.default_rng(0).normal(size=(8192, 64)).astype("float32")
    model = heavy_model()
    model.fit(SameBatch(x, 5), epochs=1, verbose=0)  # compile
    t0 = time.perf_counter()
    model.fit(SameBatch(x, 20), epochs=1, verbose=0)
    steps = max(20, int(LOAD_SECONDS / EPOCHS / ((time.perf_counter() - t0) / 20)))

    smi = subprocess.Popen(
        [
            "nvidia-smi",
            f"--query-gpu=timestamp,{power_field},{instant_field},{reasons_field}",
            "--format=csv,noheader,nounits",
            "-lms",
            "100",
            "-i",
            gpu.uuid,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    try:
        lines.append(smi.stdout.readline())  # waits for nvidia-smi's first reading: it starts before the fit
        cb, spans = GPUUtilizationLogger(log_dir=tmp_path), EpochSpans()
        history = model.fit(SameBatch(x, steps), epochs=EPOCHS, verbose=0, callbacks=[cb, spans])
        for line in smi.stdout:  # up to its first reading after the fit's end
            lines.append(line)
            if any(stamp > spans.spans[-1][1] for stamp, *_ in parse_smi([line])):
                break
    finally:
        smi.terminate()
        out, _ = smi.communicate(timeout=30)
    samples = parse_smi(lines + out.splitlines())

    h = history.history
    label = next(iter(cb.unsupported_fields), "0")
    key = f"gpu/{label}/"
    report = {
        "backend": keras.backend.backend(),
        "gpu": gpu.name,
        "smi_fields": [power_field, instant_field, reasons_field],
        "smi_samples": len(samples),
        "steps_per_epoch": steps,
        "unsupported": cb.unsupported_fields,
        "epochs": [],
    }
    for epoch, (start, end) in enumerate(spans.spans):
        smi_joules = integral(samples, start, end)
        inside = [s for s in samples if start <= s[0] <= end]
        row = {
            "seconds": round(end - start, 3),
            "energy_joules": h[key + "energy_joules"][epoch],
            "smi_joules": round(smi_joules, 1),
            "smi_instant_joules": round(integral(samples, start, end, column=3), 1),
            "smi_samples": len(inside),
        }
        for field, mask in THROTTLE_REASONS.items():
            row[field] = round(h[key + field][epoch], 2)
            row["smi_" + field] = round(100.0 * sum(1 for s in inside if s[2] & mask) / max(1, len(inside)), 2)
        report["epochs"].append(row)
    report["health"] = {k[len(key) :]: round(v[-1], 3) for k, v in h.items() if k.startswith(key)}
    print("\nGPU_HEALTH " + json.dumps(report, sort_keys=True))
    out_dir = os.environ.get("KGT_GPU_REPORT_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"gpu_health_{keras.backend.backend()}.json"), "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)

    # Hopper reports every field but NVLink where no link is active.
    for field in ("energy_joules", "dram_bandwidth_percent", "memory_clock_mhz", "sm_clock_max_mhz", *THROTTLE_REASONS):
        assert key + field in h, (field, report["unsupported"])
    for row in report["epochs"]:
        assert row["smi_samples"] >= 2, ("nvidia-smi gave too few readings in an epoch to compare", report)
        assert math.isclose(row["energy_joules"], row["smi_joules"], rel_tol=0.05), report
    for field in THROTTLE_REASONS:
        # The epochs after the first (which holds the fit's start), weighted by their length.
        rows = report["epochs"][1:]
        ours = sum(r[field] * r["seconds"] for r in rows) / sum(r["seconds"] for r in rows)
        theirs = sum(r["smi_" + field] * r["smi_samples"] for r in rows) / sum(r["smi_samples"] for r in rows)
        assert abs(ours - theirs) <= 5.0, (field, ours, theirs, report)
