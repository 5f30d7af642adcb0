"""The report's figures: counted axes (epochs, fits) have whole-number ticks; each axis has one unit."""

import pytest

from keras_gpu_tools.logdir import schema
from keras_gpu_tools.logdir.series import Series
from keras_gpu_tools.reporting import figures
from keras_gpu_tools.reporting.model import ReportData

pytest.importorskip("matplotlib")

COUNTED = ("epoch", "fit()")


def series(key, steps, values):
    return Series(key, wall=[0.0] * len(steps), steps=list(steps), values=list(values), count=len(steps), n=len(steps))


def two_epochs() -> ReportData:
    """Two epochs of two fits' memory, training curves and OOM events: matplotlib's own ticks would fall at 1.5."""
    mem = {k: series(k, [1, 2], [100.0, 110.0]) for k in (schema.MEMORY_HOST_RSS_MIB, schema.MEMORY_DEVICE_IN_USE_MIB)}
    fits = [{"fit": 1, "host_rss_mib": 100.0, "device_in_use_mib": 5.0}, {"fit": 2, "host_rss_mib": 110.0}]
    return ReportData(
        memory_series=mem,
        memory_verdict={"fits": fits},
        training={"loss": series("loss", [1, 2], [1.0, 0.5])},
        oom_series={"oom/events": series("oom/events", [1, 2], [1.0, 0.0])},
    )


def test_every_epoch_axis_ticks_whole_epochs():
    figs = figures.draw(two_epochs())
    assert {"memory", "training", "oom"} <= set(figs)
    checked = 0
    for name, fig in figs.items():
        for ax in fig.axes:
            if any(word in ax.get_xlabel() for word in COUNTED):
                lo, hi = ax.get_xlim()
                ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
                assert ticks and all(float(t).is_integer() for t in ticks), (name, ax.get_xlabel(), ticks)
                checked += 1
    assert checked >= 4  # memory (epochs, fits), training, oom


def test_the_process_and_the_machine_cpu_are_on_axes_of_their_own_units():
    """The process's CPU is in % of one core (250%: two and a half cores), the machine's in % of all cores."""
    own = series(schema.HOST_CPU_PERCENT, [1, 2, 3], [250.0, 260.0, 240.0])
    machine = series(schema.HOST_SYSTEM_CPU_PERCENT, [1, 2, 3], [40.0, 45.0, 42.0])
    rss = series(schema.HOST_RSS_MIB, [1, 2, 3], [900.0, 910.0, 905.0])
    data = ReportData(series={s.key: s for s in (own, machine, rss)}, t0=0.0)
    fig = figures.draw(data)["host"]
    by_label = {}
    for ax in fig.axes:
        labels = [ln.get_label() for ln in ax.lines]
        assert len(labels) <= 1, labels  # one unit per axis
        by_label.update({label: ax for label in labels})
    assert by_label["cpu_percent"].get_ylabel() == "% of one core"
    assert by_label["system_cpu_percent"].get_ylabel() == "% of all cores"
    assert by_label["rss_mib"].get_ylabel() == "MiB"
    # Only the process's CPU recorded: its axis alone, with its unit.
    fig = figures.draw(ReportData(series={own.key: own}, t0=0.0))["host"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["% of one core", "MiB"]
