"""Callbacks with fixed figures, and a report built from them: the report's tests without a fit."""

from keras_gpu_tools.callbacks.gpu_utilization_logger import GPUUtilizationLogger
from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.callbacks.mixed_precision_check import MixedPrecisionCheck
from keras_gpu_tools.callbacks.oom_batch_size_reducer import OOMBatchSizeReducer
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Verdict
from keras_gpu_tools.memory.events import OOMEvent
from keras_gpu_tools.mixed_precision.check import MixedPrecisionFinding
from keras_gpu_tools.reporting.report import report
from keras_gpu_tools.telemetry.nvml import GPUInfo


class FakeGPULogger(GPUUtilizationLogger):
    def __init__(self, n=30):
        super().__init__(log_dir=None)
        self.gpus = [
            (
                0,
                GPUInfo(
                    nvml_index=0,
                    uuid="GPU-a",
                    name="NVIDIA H100 80GB HBM3",
                    memory_total_bytes=80 * 2**30,
                    compute_capability=(9, 0),
                ),
            )
        ]
        self.timeline = []
        for i in range(n):
            self.timeline.append(
                (
                    1000.0 + 0.25 * i,
                    10 * i,
                    {
                        "gpu/0/utilization_percent": 40.0 + i,
                        "gpu/0/sm_activity_percent": 30.0 + i,
                        "gpu/0/memory_used_mib": 1000.0 + 10 * i,
                        "gpu/0/memory_total_mib": 81559.0,
                        "host/cpu_percent": 100.0,
                        "host/rss_mib": 900.0,
                    },
                )
            )


class FakeDetector(InputBoundDetector):
    def __init__(self):
        super().__init__(log_dir=None, verbose=0)
        self.epoch_history = [
            {
                "input/wait_ms": 3.0,
                "input/compute_ms": 1.0,
                "input/other_ms": 0.5,
                "input/step_ms": 4.5,
                "input/wait_fraction": 0.66,
            },
            {
                "input/wait_ms": 2.0,
                "input/compute_ms": 1.1,
                "input/other_ms": 0.4,
                "input/step_ms": 3.5,
                "input/wait_fraction": 0.57,
            },
        ]
        self.measurement = Measurement(
            steps=200,
            step=0.004,
            wait=0.0025,
            compute=0.00105,
            other=0.00045,
            wait_fraction=0.62,
            samples_per_sec=16000.0,
            steps_per_sec=250.0,
        )
        self.verdict = Verdict(
            "highly input-bound",
            0.62,
            "Your program is HIGHLY input-bound because 62.0% ...",
            ["Confirmed by the GPU: SM activity 45% while steps wait for input."],
            ["End the tf.data pipeline with `.prefetch(tf.data.AUTOTUNE)`."],
        )
        self.window_verdicts = [(100, self.verdict)]

    def summary(self):
        return "InputBoundDetector: highly input-bound\n\n" + self.verdict.message


class FakeOOMReducer(OOMBatchSizeReducer):
    """An OOMBatchSizeReducer after one recovery; its epoch figures went to History."""

    micro_batches = 4  # properties of the real one
    recovery_seconds = 0.5

    def __init__(self):
        super().__init__()
        self.events = [OOMEvent(step=57, batch_size=256, failed_split=1, next_split=4, kind="tensorflow")]


def fake_report():
    mp = MixedPrecisionCheck()
    mp.findings = [MixedPrecisionFinding("output_dtype", "Output `dense_1` is float16.", "dense_1")]
    history = {"loss": [1.0, 0.5], "oom/events": [1.0, 0.0], "oom/micro_batches": [4.0, 4.0]}
    return report([FakeGPULogger(), FakeDetector(), FakeOOMReducer(), mp, history], title="fake run")
