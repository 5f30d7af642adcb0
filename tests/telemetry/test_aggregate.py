"""Aggregate: samples folded into an epoch's means, sums, running totals and maxima."""

import math

from keras_gpu_tools.telemetry.aggregate import Aggregate, field_of


def test_aggregate_mean_max_and_summary():
    agg = Aggregate()
    agg.add({"gpu/0/utilization_percent": 10.0, "gpu/0/memory_used_mib": 100.0})
    agg.add({"gpu/0/utilization_percent": 30.0, "gpu/0/memory_used_mib": 300.0})
    agg.add({"gpu/0/utilization_percent": 20.0})  # a key can miss from a sample
    assert agg.means() == {"gpu/0/utilization_percent": 20.0, "gpu/0/memory_used_mib": 200.0}
    summary = agg.summary()
    assert summary["gpu/0/memory_used_mib_max"] == 300.0
    assert "gpu/0/utilization_percent_max" not in summary


def test_aggregate_summary_over_fixed_keys():
    agg = Aggregate()
    agg.add({"gpu/0/memory_used_mib": 100.0, "extra": 1.0})
    latest = {"gpu/0/memory_used_mib": 150.0, "host/rss_mib": 7.0}
    summary = agg.summary(keys=("host/rss_mib", "gpu/0/memory_used_mib"), latest=latest)
    assert summary == {
        "host/rss_mib": 7.0,
        "gpu/0/memory_used_mib": 100.0,
        "host/rss_mib_max": 7.0,
        "gpu/0/memory_used_mib_max": 100.0,
    }


def test_counts_are_summed_running_totals_take_their_last_and_a_stopped_count_is_nan():
    agg = Aggregate()
    agg.add({"gpu/0/energy_joules": 2.0, "gpu/0/ecc_corrected_errors": 3.0, "gpu/0/power_watts": 100.0})
    agg.add({"gpu/0/energy_joules": 5.0, "gpu/0/ecc_corrected_errors": 4.0, "gpu/0/power_watts": 300.0})
    assert agg.means() == {"gpu/0/energy_joules": 7.0, "gpu/0/ecc_corrected_errors": 4.0, "gpu/0/power_watts": 200.0}
    assert agg.counts_only().means() == {"gpu/0/energy_joules": 7.0}
    keys = ("gpu/0/energy_joules", "gpu/1/energy_joules", "gpu/2/energy_joules")
    summary = agg.summary(keys=keys, latest={"gpu/1/energy_joules": 9.0, "gpu/2/energy_joules": math.nan})
    assert summary["gpu/0/energy_joules"] == 7.0
    assert summary["gpu/1/energy_joules"] == 0.0  # nothing sampled in the span: what it counts is in the next
    assert math.isnan(summary["gpu/2/energy_joules"])  # stopped reporting: not measured, never 0


def test_field_of_is_the_last_part_of_the_key():
    assert field_of("gpu/0/power_watts") == "power_watts"
    assert field_of("gpu/p1:3/xid_events") == "xid_events"
    assert field_of("rss_mib") == "rss_mib"
