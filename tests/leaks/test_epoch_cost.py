"""MemoryLeakDetector's epoch end does the same work at every epoch, and logs what it logged before.

Work is counted, not timed: the readings an epoch end touches, the closures
walked to find the compiled functions, the allocator reads of a fake CUDA.
"""

import dataclasses
import random

import keras
import pytest

from keras_gpu_tools import MemoryLeakDetector
from keras_gpu_tools.backends.base import FUNCTIONS
from keras_gpu_tools.backends.torch import leaks as torch_leaks
from keras_gpu_tools.backends.torch import memory as torch_memory
from keras_gpu_tools.leaks import host
from keras_gpu_tools.leaks.readings import MIB, Reading
from keras_gpu_tools.leaks.slope import MAX_POINTS, theil_sen, with_halves
from keras_gpu_tools.leaks.traces import TraceReader
from keras_gpu_tools.leaks.track import EpochTrack
from keras_gpu_tools.leaks.verdict import grows
from keras_gpu_tools.logdir import schema
from tests.helpers.data import uniform_regression_data
from tests.helpers.models import tiny_dense_model


@pytest.fixture(autouse=True)
def _fresh_process_record():
    MemoryLeakDetector.forget_fits()
    yield
    MemoryLeakDetector.forget_fits()


class _Spy(Reading):
    """A reading that notes, in ``read``, that one of its figures was read."""

    read: set[int] = set()

    def __getattribute__(self, name):
        if name in ("host_rss", "in_use"):
            _Spy.read.add(id(self))
        return super().__getattribute__(name)


def test_the_growth_an_epoch_end_logs_reads_a_bounded_number_of_readings():
    track = EpochTrack(1, _Spy(-1, 0.0, host_rss=1e9))
    rng = random.Random(1)
    touched = []
    for epoch in range(3000):
        track.add(_Spy(epoch, float(epoch), host_rss=1e9 + epoch * MIB + rng.random() * MIB))
        _Spy.read.clear()
        g = track.growth(brief=True, halves=False)
        touched.append(len(_Spy.read))
    full = track.growth(brief=True)
    assert track.with_halves(g) == full and full.host is not None and full.host.late is not None
    assert g.epochs == 2999 and g.host is not None and g.host.per_unit == pytest.approx(1.0, abs=0.05)
    assert max(touched) <= MAX_POINTS + 2, touched[::250]  # the thinned points (and the baseline), never every epoch


def test_the_rates_alone_are_those_of_the_full_slope():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 3 * MAX_POINTS)
        xs = [float(i) for i in range(n)]
        ys = [rng.choice([rng.random() * 2**30, float(rng.randint(-3, 3)), 0.0, -0.0]) for _ in range(n)]
        full, rates = theil_sen(xs, ys), theil_sen(xs, ys, halves=False)
        if full is None:
            assert rates is None
            continue
        assert rates == dataclasses.replace(full, early=None, late=None)
        assert with_halves(rates, xs, ys) == full


def _growing_rss(monkeypatch, mib_per_epoch: float) -> list[int]:
    """This process's RSS as the detector reads it: growing ``mib_per_epoch`` a reading, with noise; the heap walks."""
    rng = random.Random(3)
    n = [0]

    def rss() -> float:
        n[0] += 1
        return 2e9 + n[0] * mib_per_epoch * MIB + rng.random() * 0.1 * MIB

    monkeypatch.setattr(host, "rss_bytes", rss)
    return n


@pytest.mark.parametrize("mib_per_epoch", [0.0, 0.5, 3.0])
def test_the_heap_is_walked_at_the_epoch_the_full_slopes_first_say_it_grows(monkeypatch, mib_per_epoch):
    _growing_rss(monkeypatch, mib_per_epoch)
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    walked: list[int] = []
    ends: list[int] = []
    monkeypatch.setattr(
        det.backend, "live_tensors", lambda heap: (walked.append(ends[-1]), (5, 100.0))[1] if heap else None
    )
    counter = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: ends.append(epoch))
    x, y = uniform_regression_data(8)
    history = tiny_dense_model().fit(x, y, batch_size=8, epochs=12, verbose=0, callbacks=[counter, det]).history

    # The epoch the full slopes (halves, confidence: what the verdict reads) first call growth, from the same readings.
    track = EpochTrack(det.warmup_epochs, det._track.start)
    expected = []
    for r in det._track.readings:
        track.add(r)
        g = track.growth(brief=True)
        if not expected and (grows(g.host, det.min_growth_mib) or grows(g.device, det.min_growth_mib)):
            expected.append(r.epoch)
    assert bool(expected) == (mib_per_epoch > 0)
    assert walked[:1] == expected  # a walk at that epoch end (and one at the fit's end), none where it is stable
    assert len(history[schema.MEMORY_LIVE_TENSORS]) == 12
    logged = [e for e, v in enumerate(history[schema.MEMORY_LIVE_TENSORS]) if v == v]
    assert logged == expected  # the count is logged at the walk's epoch end, NaN at the others


def test_the_compiled_functions_are_found_once_and_again_when_replaced():
    class Backend:
        finds = 0

        def trace_counter(self, model, names):
            Backend.finds += 1
            fn = model.train_function
            return lambda: {id(fn): fn.traces} if fn is not None else None

    def step():
        pass

    model = type("Model", (), {"train_function": None, "test_function": None, "predict_function": None})()
    reader = TraceReader(Backend(), model, ("train_function", "test_function", "predict_function"))
    assert reader() is None and reader() is None and Backend.finds == 2  # none yet: looked for each time
    step.traces = 1  # type: ignore[attr-defined]
    model.train_function = step
    for _ in range(50):
        assert reader() == {id(step): 1}
    assert Backend.finds == 3  # found once for the 50 reads

    def recompiled():
        pass

    recompiled.traces = 2  # type: ignore[attr-defined]
    model.train_function = recompiled
    assert reader() == {id(recompiled): 2} and Backend.finds == 4


@pytest.mark.multibackend
def test_an_epoch_end_finds_the_compiled_functions_once_a_fit(monkeypatch):
    finds = [0]
    det = MemoryLeakDetector(log_dir=None, verbose=0)
    real = det.backend.trace_counter

    def counted(model, names=FUNCTIONS):
        finds[0] += 1
        return real(model, names)

    monkeypatch.setattr(det.backend, "trace_counter", counted)
    x, y = uniform_regression_data(8)
    history = tiny_dense_model().fit(x, y, batch_size=8, epochs=20, verbose=0, callbacks=[det]).history
    assert finds[0] <= 3, finds  # the fit's start, the hook's wrapper: not once an epoch
    if keras.backend.backend() != "torch":  # (torch counts torch.compile's graphs: none here)
        assert history[schema.MEMORY_COMPILED_FUNCTIONS][-1] >= 1


class _FakeCuda:
    """``torch.cuda`` with two devices' nested figures; ``memory_stats`` (the flattening) is never to be called."""

    def __init__(self):
        self.reads = 0

    def is_available(self):
        return True

    def device_count(self):
        return 2

    def memory_stats_as_nested_dict(self, i):
        self.reads += 1
        return {
            "allocated_bytes": {"all": {"current": 100 + i, "peak": 300 + i}},
            "reserved_bytes": {"all": {"current": 500 + i}},
        }

    def memory_stats(self, i=None):
        raise AssertionError("memory_stats flattens every figure: read the nested ones")


def test_torch_reads_each_devices_allocator_figures_once(monkeypatch):
    cuda = _FakeCuda()
    monkeypatch.setattr(torch_memory, "available_cuda", lambda: cuda)
    monkeypatch.setattr(torch_leaks, "available_cuda", lambda: cuda)
    backend = torch_leaks.TorchLeaks("torch")
    in_use, reserved = backend.allocator_readings([0, 1, 2])
    assert in_use == {0: (100.0, 300.0), 1: (101.0, 301.0)} and reserved == {0: 500.0, 1: 501.0}
    assert cuda.reads == 2  # one read of each device for both figures
    assert torch_memory.TorchMemory("torch").allocator_memory([1]) == {1: (101.0, 301.0)}
    assert backend.allocator_reserved([0]) == {0: 500.0}


def test_jax_reads_each_devices_memory_stats_once(monkeypatch):
    from keras_gpu_tools.backends.jax import leaks as jax_leaks

    class Device:
        reads = 0

        def __init__(self, i):
            self.i = i

        def memory_stats(self):
            Device.reads += 1
            return {"bytes_in_use": 10 + self.i, "peak_bytes_in_use": 20 + self.i, "pool_bytes": 40 + self.i}

    monkeypatch.setattr(jax_leaks, "local_gpus", lambda: [Device(0), Device(1)])
    in_use, reserved = jax_leaks.JaxLeaks("jax").allocator_readings([0, 1, 5])
    assert in_use == {0: (10.0, 20.0), 1: (11.0, 21.0)} and reserved == {0: 40.0, 1: 41.0}
    assert Device.reads == 2
