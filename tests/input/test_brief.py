"""The detector's terminal lines: one sentence per verdict, its span named, short, no Markdown."""

from keras_gpu_tools.input.brief import epoch_lines, fit_lines, verdict_line
from keras_gpu_tools.input.categories import HIGH, NOT
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Phase, Verdict

LONG_DIR = "/home/someone/experiments/" + "x" * 40


def test_the_fit_line_names_its_span_and_the_bound_and_stays_short():
    m = Measurement(steps=400, step=0.0123456, wait=0.0045, wait_fraction=0.3651)
    phases = [
        Phase("epoch 1", 100, 0.6, 0.02, False, "while the cache filled"),
        Phase("epoch 2", 300, 0.36, 0.01, True),
    ]
    v = Verdict(HIGH, 0.3651, "Your program is HIGHLY ..." * 20, scope="epochs 2-5", phases=phases, speedup_bound=1.574)
    lines = fit_lines(v, m, LONG_DIR + "/input", LONG_DIR)
    assert lines[0] == (
        "InputBoundDetector: highly input-bound (steady state, epochs 2-5): 36.5% of the step time waiting for input, "
        "4.50 ms of a 12.35 ms step; without the wait at most 1.57x faster."
    )
    assert lines[1] == (
        f"InputBoundDetector: details in detector.summary(), TensorBoard (run input) and: keras-gpu-tools report {LONG_DIR}"
    )
    assert all(len(line) <= 200 and "|" not in line and "`" not in line for line in lines)


def test_an_epoch_line_and_a_fit_without_log_dir():
    m = Measurement(steps=8, step=0.002, wait=0.0001, wait_fraction=0.05 - 0.01)
    v = Verdict(NOT, 0.04, "...", scope="epoch 3")
    assert epoch_lines(v, m, None) == [
        "InputBoundDetector: not input-bound (epoch 3): 4.0% of the step time waiting for input, 0.10 ms of a 2.00 ms step."
    ]
    assert fit_lines(v, None, None, None)[1] == "InputBoundDetector: details in detector.summary()"
    assert verdict_line("X", Verdict("unknown", None, "")) == "X: input-bound: unknown (no timed training step)."
