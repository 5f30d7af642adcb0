"""InputFit: the run's verdict, made when first read, also from another thread (LiveView's drawing)."""

import random
import threading

from keras_gpu_tools.input.fit import InputFit
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Judge


def _epoch(rng: random.Random) -> Measurement:
    step = rng.uniform(0.004, 0.006)
    wait = step * rng.uniform(0.0, 0.1)
    m = Measurement(steps=5, sampled_steps=1, fetch=wait, compute=step - wait, other=0.0, step=step, wait=wait)
    m.wait_fraction, m.steps_per_sec, m.samples_per_sec = wait / step, 1 / step, 4 / step
    return m


def test_a_verdict_read_on_another_thread_never_replaces_the_final_one():
    rng = random.Random(0)
    fit = InputFit(Judge(0.05, 0.2, {"kind": "arrays"}, {"gpu": False, "cores": 2, "epochs": 10}))
    for i in range(10):
        fit.spans.add_window("w", _epoch(rng), float(i))
        fit.end_epoch(i, float(i), step=i)
    real = fit.spans.steady_state
    entered, release = threading.Event(), threading.Event()

    def slow_steady_state(*args, **kwargs):  # the reader's, held until the final verdict is made
        if threading.current_thread().name == "reader":
            entered.set()
            release.wait(5)
        return real(*args, **kwargs)

    fit.spans.steady_state = slow_steady_state
    read = []
    reader = threading.Thread(target=lambda: read.append(fit.verdict), name="reader")
    reader.start()
    assert entered.wait(5)
    fit.update(final=True)  # fit() ends while the reader makes the verdict of the epochs so far
    final = fit._verdict
    release.set()
    reader.join(5)
    assert final is not None and read and read[0] is not None
    assert fit.verdict is final and fit._verdict is final  # the reader's older verdict was not kept
