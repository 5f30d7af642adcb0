"""The detector's epoch and window verdicts are made when first read: the same verdicts as made at the epoch end.

What changes after an epoch end (the GPU logger's new points, the host figures of the next epoch)
never reaches a verdict made later; every reader gets the same objects, each made once.
"""

import collections
import threading

from keras_gpu_tools.input.fit import InputFit
from keras_gpu_tools.input.later import Later, LaterList
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.timing import BatchSizes, StepStats
from keras_gpu_tools.input.verdict import Judge


class _Logger:
    def __init__(self):
        self.timeline = collections.deque()


def _judge(logger):
    return Judge(0.05, 0.2, {"kind": "PyDataset", "workers": 1}, {"gpu": True, "cores": 8, "epochs": 3}, logger)


def _m(wait: float, step: float = 0.010) -> Measurement:
    return Measurement(
        steps=10,
        sampled_steps=2,
        fetch=wait,
        compute=step - wait,
        other=0.0,
        step=step,
        wait=wait,
        wait_fraction=wait / step,
    )


def test_verdicts_made_later_are_those_of_the_epoch_end():
    logger = _Logger()
    logger.timeline.append((100.0, 5, {"gpu/0/utilization_percent": 30.0}))
    judge = _judge(logger)
    judge.host = {"cpu_count": 8.0, "process_cpu_percent": 95.0}
    fit = InputFit(judge)
    fit.spans.add_window("steps 1-10", _m(0.004), 99.0)
    end = fit.end_epoch(0, 99.0, 10)
    expected = judge(end.measurement, 99.0, scope="epoch 1", cache_serves=False)  # made at once, at the epoch end

    # After the epoch end: a new point of the GPU logger, the next epoch's host figures.
    logger.timeline.append((200.0, 20, {"gpu/0/utilization_percent": 99.0}))
    judge.host = {"cpu_count": 8.0, "process_cpu_percent": 5.0}

    (made,) = fit.epoch_verdicts
    assert made == expected and made.advice and made.evidence == expected.evidence
    assert end.verdict is made and fit.epoch_verdicts[0] is made  # one object for every reader


def test_window_verdicts_are_made_in_order_once_without_advice():
    judge = _judge(None)
    fit = InputFit(judge)
    assert fit.close_window(StepStats(BatchSizes()), 0.0, 10) is None  # no step: nothing judged
    waits = [0.001, 0.004, 0.0005]
    expected = [judge(_m(w), 50.0 + i, scope=f"steps {i}", with_advice=False) for i, w in enumerate(waits)]
    for i, w in enumerate(waits):
        v = judge.later(_m(w), 50.0 + i, scope=f"steps {i}", with_advice=False)
        fit._window_verdicts.add(lambda v=v, i=i: (i, v()))
    first = fit.window_verdicts
    assert [s for s, _ in first] == [0, 1, 2]
    assert [v.message for _, v in first] == [e.message for e in expected]
    assert fit.window_verdicts is first and len(first) == 3  # the same list, made once


def test_a_later_value_is_made_once_whichever_thread_reads_first():
    made = []
    later = Later(lambda: made.append(1) or object())
    results = []
    threads = [threading.Thread(target=lambda: results.append(later())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(r is results[0] for r in results)

    items = LaterList([0])
    for i in range(1, 50):
        items.add(lambda i=i: i)
    assert items.items() == list(range(50)) and items.items() is items.items()
