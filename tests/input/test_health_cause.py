"""Why a process of a job is slow, from its GPU health against the other processes': the rule and its words."""

import warnings

import pytest

from keras_gpu_tools.errors import InputPipelineWarning
from keras_gpu_tools.input import health_cause as hc
from keras_gpu_tools.input import stragglers as sg
from keras_gpu_tools.input.job import JobExchange
from keras_gpu_tools.runtime.topology import JobGather, Topology
from keras_gpu_tools.telemetry.health_fields import SHARED_GPU_HEALTH
from tests.helpers.gpu_health import FakeGPUHealth, healthy


def row(i, step=20.0, wait=0.02, compute=18.0, gpus=None):
    """Process ``i``'s row; ``gpus``: its GPUs' epoch figures by label (None: no logger in its fit)."""
    figs = {
        "input/steps": 90.0,
        "input/step_ms": step,
        "input/wait_fraction": wait,
        "input/wait_ms": wait * step,
        "input/compute_ms": compute,
        "throughput/samples_per_sec": 800.0,
    }
    return sg.process_row(i, f"node-{i}", figs, figs, scope="epochs 2-3", health=hc.process_health(gpus))


def test_a_process_sends_the_worst_of_its_gpus_per_figure_in_a_small_payload():
    h = hc.process_health(
        {
            "0": healthy(throttle_power_percent=5.0),
            "1": healthy(clock=1500.0, throttle_power_percent=41.0, temperature_celsius=83.0),
        }
    )
    assert h["throttle_power_percent"] == [41.0, "1"] and h["sm_clock_mhz"] == [1500.0, "1"]
    assert h["sm_clock_max_mhz"] == [1980.0, "1"] and h["temperature_celsius"] == [83.0, "1"]
    assert set(h) == {*hc.THROTTLES, "sm_clock_mhz", "sm_clock_max_mhz", "utilization_percent", "temperature_celsius"}
    assert hc.process_health(None) is None and hc.process_health({}) is None
    # A field the GPU cannot report is absent from its figures: absent from the summary, never 0.
    assert hc.process_health({"0": {"sm_clock_mhz": 1400.0}}) == {"sm_clock_mhz": [1400.0, "0"]}


def test_a_slow_step_is_explained_by_its_power_throttled_gpu():
    rows = [
        row(0, step=10.0, gpus={"0": healthy()}),
        row(1, step=10.4, gpus={"1": healthy()}),
        row(2, step=13.0, gpus={"2": healthy(clock=1900.0, throttle_power_percent=41.0)}),
    ]
    v = sg.job_verdict(rows)
    (s,) = v.stragglers
    assert (s.process, s.kind) == (2, "step time") and [c.field for c in s.causes] == ["throttle_power_percent"]
    assert "Process 2 is slower" in v.message
    assert "process 2's GPU 2 was power-throttled 41% of the epoch (the other processes' 0%)" in v.message
    assert "its steps were 27% slower" in v.message  # 13.0 against the others' 10.2 ms
    assert v.advice == [f"Process 2: {hc.THROTTLES['throttle_power_percent'][1]}."]
    # Every process computes the same from the same rows, whatever their order.
    assert sg.job_verdict(list(reversed(rows))) == v


def test_under_synchronous_steps_a_throttled_gpu_is_the_straggler_its_step_cannot_show():
    # Every process steps at the slowest one's pace: only its GPU says which one holds the job back.
    rows = [
        row(0, gpus={"0": healthy()}),
        row(1, gpus={"1": healthy(clock=1620.0, throttle_thermal_percent=62.0, temperature_celsius=91.0)}),
    ]
    v = sg.job_verdict(rows)
    (s,) = v.stragglers
    assert (s.process, s.kind) == (1, "GPU health") and s.value == 62.0 and s.others_median == 0.0
    assert [c.field for c in s.causes] == ["throttle_thermal_percent", "sm_clock_mhz"]
    assert v.message.startswith("Process 1's GPU holds the job back: process 1's GPU 1 was thermally throttled 62%")
    assert "ran its SM clock at 1620 MHz, 82% of its 1980 MHz maximum (the other processes' at 100% of theirs)" in (
        v.message
    )
    assert "its steps take as long as the others'" in v.message and "all-reduce" in v.message
    assert "cooling" in v.advice[0] and "nvidia-smi -q -d CLOCK" in v.advice[1]
    assert "| 1 (straggler) | node-1 |" in v.text()


@pytest.mark.parametrize(
    "slow",
    [
        healthy(throttle_power_percent=9.0),  # under 10% of the epoch
        healthy(throttle_power_percent=24.0),  # 14 points above the others' 10%: not well above
        healthy(clock=1860.0),  # 94% of the others' clock
        healthy(clock=1950.0, sm_clock_max_mhz=1980.0),
        healthy(utilization_percent=100.0),  # busy, but its own steps account for 90 of it
    ],
)
def test_a_health_figure_that_does_not_stand_out_names_no_cause(slow):
    others = healthy(throttle_power_percent=10.0)
    rows = [row(0, gpus={"0": others}), row(1, gpus={"1": others}), row(2, gpus={"2": slow})]
    assert hc.health_causes(rows, 2) == [] and sg.job_verdict(rows).stragglers == []


def test_gpus_of_different_models_compare_their_clocks_against_their_own_maximum():
    a100, h100 = (
        {"sm_clock_mhz": 1410.0, "sm_clock_max_mhz": 1410.0},
        {"sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0},
    )
    rows = [row(0, gpus={"0": h100}), row(1, gpus={"1": a100})]
    assert hc.health_causes(rows, 1) == []  # slower in MHz, yet at its own maximum
    rows = [row(0, gpus={"0": h100}), row(1, gpus={"1": dict(a100, sm_clock_mhz=1100.0)})]
    (c,) = hc.health_causes(rows, 1)
    assert c.field == "sm_clock_mhz" and "78% of its 1410 MHz maximum" in c.text
    # Without the maxima: MHz against MHz.
    rows = [row(0, gpus={"0": {"sm_clock_mhz": 1980.0}}), row(1, gpus={"1": {"sm_clock_mhz": 1700.0}})]
    (c,) = hc.health_causes(rows, 1)
    assert c.text == "process 1's GPU 1 ran its SM clock at 1700 MHz (the other processes' at 1980 MHz)"


def test_a_gpu_busy_beyond_its_own_steps_has_another_program_on_it():
    # Process 1's steps keep its GPU busy 25% of the step (5 of 20 ms), yet NVML sees a kernel 95% of the time.
    rows = [
        row(0, compute=5.0, gpus={"0": healthy(utilization_percent=28.0)}),
        row(1, step=27.0, compute=6.75, gpus={"1": healthy(utilization_percent=95.0)}),
    ]
    v = sg.job_verdict(rows)
    (s,) = v.stragglers
    assert s.kind == "step time" and [c.field for c in s.causes] == ["other_load"]
    assert "busy 95% of the time, 70 points more than its own steps account for (the other processes' 3)" in (v.message)
    assert "nvidia-smi" in v.advice[0] and "another program" in v.advice[0]


def test_without_every_process_health_no_cause_is_claimed():
    # The slow process sends none: nothing about health, and the advice says how to get it.
    rows = [row(0, step=10.0, gpus={"0": healthy()}), row(1, step=10.2, gpus={"1": healthy()}), row(2, step=14.0)]
    v = sg.job_verdict(rows)
    assert v.stragglers[0].causes == [] and "GPU" not in v.message.split("stands out.")[-1].split("If the")[0]
    assert "health" not in v.message and "a GPUUtilizationLogger in every process's fit" in v.advice[0]
    # Only the slow one sends it: nothing to compare with.
    rows = [row(0, step=10.0), row(1, step=14.0, gpus={"1": healthy(throttle_power_percent=50.0)})]
    assert sg.job_verdict(rows).stragglers[0].causes == []
    # Every process sends it, and nothing stands out: said so, the generic advice without the logger.
    rows = [row(0, step=10.0, gpus={"0": healthy()}), row(1, step=14.0, gpus={"1": healthy()})]
    v = sg.job_verdict(rows)
    assert "Its GPU's health does not explain it" in v.message and "GPUUtilizationLogger" not in v.advice[0]


def test_an_input_wait_straggler_is_not_blamed_on_its_gpu_whose_health_is_still_named():
    rows = [row(0, gpus={"0": healthy()}), row(1, wait=0.4, gpus={"1": healthy(throttle_power_percent=30.0)})]
    v = sg.job_verdict(rows)
    (s,) = v.stragglers
    assert (s.process, s.kind) == (1, "input wait") and [c.field for c in s.causes] == ["throttle_power_percent"]
    assert v.message.startswith("Process 1 holds the job back: it waits for input 40.0%")
    assert v.message.endswith(
        "Its GPU needs a look too, though its input is what holds the job back now: process 1's GPU 1 was "
        "power-throttled 30% of the epoch (the other processes' 0%)."
    )
    assert v.advice[0] == f"Process 1: {hc.THROTTLES['throttle_power_percent'][1]}."
    # A healthy GPU beside the slow input: nothing about health.
    rows[1] = row(1, wait=0.4, gpus={"1": healthy()})
    v = sg.job_verdict(rows)
    assert v.stragglers[0].causes == [] and "GPU" not in v.message


class _FakeChannel:
    """A job of two processes whose other process sends ``other`` (the store's gather, answered at once)."""

    def __init__(self, other):
        self.other = other

    def gather(self, key, value, timeout_s):
        return [value, self.other]


def test_the_exchange_sends_the_health_the_logger_publishes_and_goes_on_without_it():
    from keras_gpu_tools.input.measure import Measurement

    other = row(1, gpus={"1": healthy()})
    topo = Topology(process_index=0, process_count=2, exchange=_FakeChannel(other))
    m = Measurement(steps=30, step=0.02, wait=0.0004, compute=0.018, other=0.0016, wait_fraction=0.02)
    source = FakeGPUHealth({"0": healthy(clock=1500.0, throttle_power_percent=45.0)})
    ex = JobExchange(JobGather(topo, "t", print), 1, lambda: None, {SHARED_GPU_HEALTH: source})
    out = ex.epoch(0, m, m, None, None, step=30)
    assert source.calls == 1 and out.verdict.straggler_processes == [0]
    assert "process 0's GPU 0 was power-throttled 45% of the epoch" in out.verdict.message
    # No logger in the fit: the row says nothing of health.
    ex = JobExchange(JobGather(topo, "t2", print), 1, lambda: None, {})
    assert ex.health() is None and ex.epoch(0, m, m, None, None, step=30).verdict.stragglers == []

    class Broken:
        def last_epoch(self):
            raise RuntimeError("sampler gone")

    ex = JobExchange(JobGather(topo, "t3", print), 1, lambda: None, {SHARED_GPU_HEALTH: Broken()})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ex.epoch(0, m, m, None, None, step=30) is not None and ex.health() is None
    assert [str(w.message) for w in caught if w.category is InputPipelineWarning] == [
        "InputBoundDetector: the GPU health is left out of the job's verdict for this fit(): "
        "RuntimeError('sampler gone')"
    ]
