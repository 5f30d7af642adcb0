"""The report's GPU health section: only what deserves attention, a plot per such GPU, what a GPU cannot report."""

import json

import numpy as np
import pytest

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.reporting import text
from keras_gpu_tools.reporting.from_logdir import gather_log_dir
from keras_gpu_tools.reporting.html import badges
from keras_gpu_tools.reporting.report import TrainingReport, report
from keras_gpu_tools.reporting.sections import gpu_health as health
from keras_gpu_tools.telemetry.health_fields import HEALTH_FIELDS
from keras_gpu_tools.telemetry.nvml import NVML
from tests.helpers.data import regression_data
from tests.helpers.fake_nvml import FakeGPU, FakeNVML
from tests.helpers.models import tiny_dense_model
from tests.helpers.timing_telemetry import TickAt, manual_sampling

STEPS = 10  # per epoch; the logger samples 5 points an epoch, at steps 2, 4, ..., 10 of it
UNSUPPORTED = {
    "0": {"dram_bandwidth_percent": "GPM needs Hopper or later (compute capability 8.0)"},
    "1": {
        "dram_bandwidth_percent": "GPM needs Hopper or later (compute capability 8.0)",
        "energy_joules": "no total-energy counter on this GPU",
    },
}

# Each GPU's sampled points per epoch (5 each) and its per-epoch health figures, as the logger writes them.
HOT = {
    "points": {
        "utilization_percent": [[95.0] * 5] * 4,
        "sm_clock_mhz": [[1500.0] * 5] * 4,
        "power_watts": [[690.0, 695.0, 700.0, 695.0, 695.0]] * 4,
        "power_limit_watts": [[700.0] * 5] * 4,
        "temperature_celsius": [[80.0, 82.0, 84.0, 83.0, 82.0]] * 2
        + [[84.0, 86.0, 88.0, 86.0, 85.0], [81.0, 82.0, 84.0, 83.0, 82.0]],
    },
    "epochs": {
        "throttle_power_percent": [0.0, 45.0, 60.0, 40.0],
        "throttle_thermal_percent": [0.0, 0.0, 0.0, 0.0],
        "throttle_hw_slowdown_percent": [0.0, 0.0, 0.0, 0.0],
        "throttle_sync_boost_percent": [0.0, 0.0, 0.0, 0.0],
        "throttle_app_clocks_percent": [0.0, 0.0, 0.0, 0.0],
        "sm_clock_max_mhz": [1980.0] * 4,
        "ecc_uncorrected_errors": [0.0] * 4,
        "ecc_corrected_errors": [3.0, 3.0, 5.0, 5.0],
        "xid_events": [0.0, 0.0, 2.0, 0.0],
        "energy_joules": [40000.0, 42000.0, 41000.0, 41000.0],
    },
}
COOL = {
    "points": {
        "utilization_percent": [[90.0] * 5] * 4,
        "sm_clock_mhz": [[1980.0] * 5] * 4,
        "power_watts": [[400.0] * 5] * 4,
        "power_limit_watts": [[700.0] * 5] * 4,
        "temperature_celsius": [[60.0] * 5] * 4,
    },
    "epochs": {
        **{key: [0.0] * 4 for key in health.THROTTLE_WORDS},
        "sm_clock_max_mhz": [1980.0] * 4,
        "xid_events": [0.0] * 4,
    },
}
HOT_LINES = [
    "GPU 0:",
    "- the power cap held the clocks down 36% of the time over 4 epochs (epochs 2-4; at most 60% in epoch 3).",
    "- the SM clock ran at 1500 MHz under load, 76% of its 1980 MHz maximum (below 90% in epochs 1-4).",
    "- corrected ECC errors rose from 3 to 5 during the run: memory cells are wearing out; watch `nvidia-smi -q -d ECC`.",
    "- 2 XID error event(s) in epoch 3: the driver reported a GPU error (the logger warned with its code; the kernel "
    "log has the details).",
    "- the temperature reached 88 deg C (epoch 3), where GPUs begin to slow down.",
    "- power at its limit: 695 W of 700 W on average in epochs 1-4.",
]
ENERGY_LINES = [
    health.ENERGY,
    "- GPU 0: 41.00 kJ per epoch, 164.00 kJ over 4 epochs.",
    "- Energy per training sample: 0.51 J (the last figure logged).",
]
UNSUPPORTED_LINES = [
    health.UNSUPPORTED,
    "- GPU 0: dram_bandwidth_percent (GPM needs Hopper or later (compute capability 8.0))",
    "- GPU 1: dram_bandwidth_percent (GPM needs Hopper or later (compute capability 8.0)); energy_joules (no "
    "total-energy counter on this GPU)",
]


def epoch_figures(gpus, e):
    """Epoch `e`'s GPU figures as the logger computes them (History's): means, maxima, the health figures."""
    h = {}
    for label, g in gpus.items():
        for field, per_epoch in g["points"].items():
            h[schema.gpu_key(label, field)] = float(np.mean(per_epoch[e]))
            if field in ("temperature_celsius", "power_watts"):
                h[schema.gpu_key(label, field) + "_max"] = max(per_epoch[e])
        h.update({schema.gpu_key(label, f): v[e] for f, v in g["epochs"].items()})
    return h


def write_logger_run(run_dir, gpus, joules_per_sample=(0.5, 0.52, 0.5, 0.51), unsupported=UNSUPPORTED, epoch_tags=True):
    """A GPUUtilizationLogger's run as the logger writes it: every field's sampled points on the step axis
    (the health fields too: energy as the joules since the previous point), and at each epoch's end the
    epoch figures as `gpu_epoch/...` (left out with `epoch_tags=False`: the layout of earlier versions)."""
    w = EventWriter(str(run_dir))
    for e in range(4):
        for k in range(5):
            step = e * STEPS + 2 * (k + 1)
            values = {
                schema.gpu_key(label, field): per_epoch[e][k]
                for label, g in gpus.items()
                for field, per_epoch in g["points"].items()
            }
            for label, g in gpus.items():  # sampled health: shares as they were, energy a fifth an epoch each
                for field, per_epoch in g["epochs"].items():
                    values[schema.gpu_key(label, field)] = (
                        per_epoch[e] / 5 if field == "energy_joules" else per_epoch[e]
                    )
            w.scalars(values, step=step, wall_time=100.0 + step)
        end = schema.gpu_epoch_figures(epoch_figures(gpus, e)) if epoch_tags else {}
        if joules_per_sample:
            end[schema.JOULES_PER_SAMPLE] = joules_per_sample[e]
        w.scalars(end, step=(e + 1) * STEPS, wall_time=100.0 + (e + 1) * STEPS)
    if unsupported is not None:
        w.text(schema.GPU_UNSUPPORTED_TEXT, "fields not supported: ...", step=0)
        w.json(schema.GPU_UNSUPPORTED_TEXT + schema.DATA_SUFFIX, unsupported, step=0)
    w.close()


def section(data):
    sections = dict(text.sections(data))
    return sections.get(health.HEADING)


def test_only_what_deserves_attention_per_gpu_with_energy_and_unsupported_fields(tmp_path):
    write_logger_run(tmp_path / "gpu", {"0": HOT, "1": COOL})
    data = gather_log_dir(str(tmp_path))
    # GPU 1 is healthy: not listed; GPU 0's findings in the order of the rules.
    assert section(data) == HOT_LINES + ENERGY_LINES + UNSUPPORTED_LINES
    assert data.gpu_unsupported == UNSUPPORTED
    # One value per epoch, the logger's own (History's), never the sampled points re-averaged.
    assert data.gpu_epochs["gpu/0/sm_clock_mhz"] == [1500.0] * 4
    assert data.gpu_epochs["gpu/0/energy_joules"] == HOT["epochs"]["energy_joules"]
    assert data.gpu_epochs["gpu/0/temperature_celsius_max"] == [84.0, 84.0, 88.0, 84.0]
    r = TrainingReport(data)
    page = r.html()
    assert "<h3>GPU health</h3>" in page and "power cap held the clocks down 36%" in page
    assert "no total-energy counter on this GPU" in page
    assert ("GPU health: 6 finding(s)", "warn") in badges(data)
    # A plot for the GPU whose health deserves attention, none for the healthy one.
    figs = r.figures()
    assert "health_0" in figs and "health_1" not in figs and 'data-figure="health_0"' in page
    ax_t, ax_c, ax_p = figs["health_0"].axes
    lines = {ln.get_label(): ln for ln in ax_t.lines}
    assert list(lines) == ["throttle_power_percent"]  # the reasons never active are left out
    np.testing.assert_array_equal(lines["throttle_power_percent"].get_xdata(), [1, 2, 3, 4])
    np.testing.assert_array_equal(lines["throttle_power_percent"].get_ydata(), [0.0, 45.0, 60.0, 40.0])
    clocks = {ln.get_label(): ln.get_ydata().tolist() for ln in ax_c.lines}
    assert clocks == {"sm_clock_mhz": [1500.0] * 4, "sm_clock_max_mhz": [1980.0] * 4}
    power = {ln.get_label(): ln.get_ydata().tolist() for ln in ax_p.lines}
    assert power == {"power_watts": [695.0] * 4, "power_limit_watts": [700.0] * 4}


def test_nothing_to_note_is_one_line(tmp_path):
    write_logger_run(tmp_path / "gpu", {"1": COOL}, joules_per_sample=None, unsupported=None)
    data = gather_log_dir(str(tmp_path))
    assert section(data) == [
        "Nothing in the GPUs' health deserves attention: no throttling, clocks at their maximum under load, no ECC "
        "or XID errors, temperature and power within limits (1 GPU, 4 epochs)."
    ]
    r = TrainingReport(data)
    assert not [name for name in r.figures() if name.startswith("health_")]
    assert '<p class="kgt-health-ok">Nothing in the GPUs' in r.html()


def test_logs_of_the_earlier_layout_have_no_per_epoch_health(tmp_path):
    # Health fields as sampled series alone (no `gpu_epoch/` tags): they are not taken for epochs.
    write_logger_run(tmp_path / "gpu", {"0": HOT}, joules_per_sample=None, epoch_tags=False)
    data = gather_log_dir(str(tmp_path))
    assert data.gpu_epochs == {} and "gpu/0/throttle_power_percent" in data.series
    assert section(data) == [
        "No GPU health figures per epoch in these logs (an earlier version's, or no epoch ended).",
        *UNSUPPORTED_LINES,
    ]


def test_logs_without_health_figures_have_no_section(tmp_path):
    w = EventWriter(str(tmp_path / "gpu"))
    for step in range(1, 6):
        w.scalars({"gpu/0/utilization_percent": 50.0, "gpu/0/sm_clock_mhz": 1000.0}, step=step)
    w.close()
    data = gather_log_dir(str(tmp_path))
    assert section(data) is None and not health.has_health(data)
    assert "GPU health" not in TrainingReport(data).html()


class EpochLogger(GPUUtilizationLogger):
    """A GPUUtilizationLogger after a fit: its epoch figures (History's) and the fields its GPUs cannot report."""

    def __init__(self, gpus):
        super().__init__(log_dir=None)
        self.timeline = []
        self.epoch_history = []
        for e in range(4):
            h = epoch_figures(gpus, e)
            h[schema.JOULES_PER_SAMPLE] = (0.5, 0.52, 0.5, 0.51)[e]
            self.epoch_history.append(h)

    @property
    def unsupported_fields(self):
        return UNSUPPORTED


def test_the_callbacks_and_the_log_dir_make_the_same_section(tmp_path):
    write_logger_run(tmp_path / "gpu", {"0": HOT, "1": COOL})
    from_logs = section(gather_log_dir(str(tmp_path)))
    lg = EpochLogger({"0": HOT, "1": COOL})
    r = report(lg)
    assert section(r.data) == from_logs
    assert "health_0" in r.figures()
    # The log directory fills in what the callbacks lack.
    bare = GPUUtilizationLogger(log_dir=None)
    assert section(report(bare, log_dir=str(tmp_path)).data) == from_logs


def test_a_job_shows_every_process_gpus_health_and_unsupported_fields(tmp_path):
    write_logger_run(tmp_path / "gpu" / "process_0", {"0": COOL}, unsupported={"0": UNSUPPORTED["0"]})
    write_logger_run(tmp_path / "gpu" / "process_1", {"1": HOT}, unsupported={"1": UNSUPPORTED["1"]})
    data = gather_log_dir(str(tmp_path))
    assert data.processes == [0, 1] and data.gpu_unsupported == UNSUPPORTED
    lines = section(data)
    assert lines[0] == "GPU 1:" and lines[1].startswith("- the power cap held the clocks down 36%")
    assert lines[-3:] == UNSUPPORTED_LINES
    assert "- GPU 1: 41.00 kJ per epoch, 164.00 kJ over 4 epochs." in lines


@pytest.mark.parametrize(
    "indices, words",
    [([0], "epoch 1"), ([1, 2, 3], "epochs 2-4"), ([0, 2, 3, 6], "epochs 1, 3-4, 7"), ([3, 1, 2], "epochs 2-4")],
)
def test_epochs_are_named_as_ranges(indices, words):
    assert health.epochs_text(indices) == words


def test_the_unsupported_record_round_trips_as_json(tmp_path):
    write_logger_run(
        tmp_path / "gpu", {"1": COOL}, unsupported={"1": {"xid_events": "no event set: " + json.dumps("x")}}
    )
    assert gather_log_dir(str(tmp_path)).gpu_unsupported == {"1": {"xid_events": 'no event set: "x"'}}


@pytest.mark.multibackend
def test_a_real_fit_gives_one_health_figure_per_epoch_as_history_has_it(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # At the power cap, and without NVLink: the fields it cannot report are in both views too.
    nvml = NVML(FakeNVML([FakeGPU(power_mw=690_000, clock_reasons=0x4, ecc_corrected=2, nvlink_links=0)]))
    x, y = regression_data(256)
    jobs = manual_sampling(monkeypatch)  # four samples an epoch, taken at these batches whatever the load
    lg = GPUUtilizationLogger(log_dir=tmp_path, interval=0.01, nvml=nvml)
    history = tiny_dense_model().fit(
        x, y, batch_size=16, epochs=3, verbose=0, callbacks=[lg, TickAt(jobs, {3, 7, 11, 15})]
    )
    data = gather_log_dir(str(tmp_path))
    # The sampled series have more points than the fit has epochs; the section reads one value an epoch.
    assert len(data.series["gpu/0/throttle_power_percent"].values) == 4 * 3
    fields = [f for f in HEALTH_FIELDS if f"gpu/0/{f}" in history.history]
    assert {"throttle_power_percent", "energy_joules", "sm_clock_max_mhz", "ecc_corrected_errors"} <= set(fields)
    for field in fields:
        key = f"gpu/0/{field}"
        assert data.gpu_epochs[key] == pytest.approx(history.history[key], rel=1e-6), field
    for key in ("gpu/0/power_watts", "gpu/0/temperature_celsius_max", "gpu/0/utilization_percent"):
        assert data.gpu_epochs[key] == pytest.approx(history.history[key], rel=1e-6), key
    lines = section(data)
    assert lines[0] == "GPU 0:"
    assert lines[1].startswith("- the power cap held the clocks down 100% of the time over 3 epochs (epochs 1-3;")
    assert any(line.startswith("- GPU 0: ") and "over 3 epochs" in line for line in lines)  # the energy
    assert any("nvlink_rx_mib_per_sec" in line for line in lines)
    assert section(report(lg).data) == lines  # the callback's view and the log directory's agree
