"""FitInput: a timed window's steps divide a finite input's pass and hold whole calls."""

import numpy as np
import pytest

from keras_gpu_tools.memory.timed_fit import LONG_CPU_BUDGET, FitInput, Pace
from tests.helpers.models import BACKEND


def test_a_window_divides_the_pass_and_holds_whole_calls():
    endless = FitInput(dict)
    assert [endless.steps(k) for k in (1, 7, 40)] == [1, 7, 40]
    finite = FitInput(dict, batches=12)
    assert [finite.steps(k) for k in (1, 5, 7, 12, 100)] == [1, 4, 6, 12, 12]
    calls = FitInput(dict, batches=32, per_call=4)
    assert [calls.steps(k) for k in (1, 6, 9, 100)] == [4, 4, 8, 32]
    assert FitInput(dict, per_call=4).steps(10) == 8
    assert FitInput(dict, batches=7, per_call=2).steps(10) == 7  # no multiple of 2 divides 7: the whole pass
    assert FitInput(dict, batches=1001, per_call=2).steps(10) == 10  # unless the pass is long: whole calls
    # A call of more steps than a pass runs the pass: a window of more would run past its end.
    assert [FitInput(dict, batches=3, per_call=8).steps(k) for k in (1, 10, 100)] == [3, 3, 3]


def test_a_cpu_budget_of_a_minute_or_more_times_longer_windows():
    short, long = Pace.for_device(False), Pace.for_device(False, LONG_CPU_BUDGET)
    assert Pace.for_device(False, LONG_CPU_BUDGET - 1) == short and Pace.for_device(False, None) == short
    assert long.epoch_seconds > short.epoch_seconds and long.max_steps_per_epoch > short.max_steps_per_epoch
    assert long.max_windows > short.max_windows
    assert Pace.for_device(True) == Pace.for_device(True, LONG_CPU_BUDGET) == Pace()  # a GPU's pace: the budget aside


def test_an_input_that_restarts_its_workers_every_epoch_is_timed_over_whole_passes():
    assert [FitInput(dict, batches=12, whole_passes=True).steps(k) for k in (1, 5, 40)] == [12, 12, 12]
    assert FitInput(dict, whole_passes=True).steps(5) == 5  # endless: no pass to keep whole


def _dense(samples: int, steps_per_execution: int = 1):
    """A one-layer model whose ``fit`` records each call's ``steps_per_epoch`` (the list returned), and its data."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    asked: list = []
    fit = model.fit

    def recorded(*args, **kwargs):
        asked.append(kwargs["steps_per_epoch"])
        return fit(*args, **kwargs)

    model.fit = recorded
    return model, asked, np.ones((samples, 4), "float32"), np.ones((samples, 1), "float32")


@pytest.mark.multibackend
def test_a_window_of_a_whole_pass_is_fitted_as_a_user_s_epoch():
    """No steps_per_epoch where a window is the pass: Keras starts the input afresh each epoch, as in a user's fit."""
    from keras_gpu_tools.memory.timed_fit import time_fit

    model, asked, x, y = _dense(64)
    pace = Pace(epoch_seconds=10.0, min_windows=2, max_windows=3)  # windows as long as the pass allows
    timing = time_fit(model, FitInput(lambda: {"x": x, "y": y, "batch_size": 16}, batches=4), pace)
    assert asked[0] == 1 and set(asked[1:]) == {None}  # the rough steps, then windows of the whole pass
    assert timing.steps == 4 * timing.windows
    asked.clear()
    time_fit(model, FitInput(lambda: {"x": x, "y": y, "batch_size": 8}, batches=8), Pace(epoch_seconds=1e-9))
    assert set(asked) == {1, 2}  # windows shorter than the pass (2 of its 8 steps, the fewest a window holds)


@pytest.mark.multibackend
def test_an_input_timed_over_whole_passes_is_timed_in_one_fit():
    """Its first pass compiles, its second warms up, the windows follow: no rough fit of passes thrown away."""
    from keras_gpu_tools.memory.timed_fit import time_fit

    model, asked, x, y = _dense(64)
    inputs = FitInput(lambda: {"x": x, "y": y, "batch_size": 16}, batches=4, whole_passes=True)
    timing = time_fit(model, inputs, Pace(epoch_seconds=10.0, min_windows=2, max_windows=3))
    assert asked == [None] and 2 <= timing.windows <= 3 and timing.steps == 4 * timing.windows
    assert model.history.epoch[-1] == timing.windows + 1  # two passes before the windows


@pytest.mark.multibackend
def test_calls_that_divide_no_window_of_the_pass_are_timed_over_whole_passes():
    """7 batches at 2 steps a call: a window of calls would cross the pass's end, where Keras runs a call of one
    step; a whole pass runs all 7 steps, as the window counts them."""
    from keras_gpu_tools import backends
    from keras_gpu_tools.memory.timed_fit import time_fit

    if not getattr(backends.get(), "several_steps_per_call", True):
        pytest.skip("this backend's trainer runs one step per call")
    model, asked, x, y = _dense(56, steps_per_execution=2)
    inputs = FitInput(lambda: {"x": x, "y": y, "batch_size": 8}, batches=7, per_call=2)
    timing = time_fit(model, inputs, Pace(epoch_seconds=10.0, min_windows=2, max_windows=3))
    # The rough steps (three epochs of one call: 6 of the 7 batches), then windows of the whole pass.
    assert asked[0] == 2 and set(asked[1:]) == {None} and timing.steps == 7 * timing.windows


@pytest.mark.multibackend
def test_one_batch_is_repeated_in_the_backend_s_own_pipeline_where_it_has_one():
    """TensorFlow's tf.data (a generator costs a py_function call per step there); on JAX the batch placed on
    the device once (no host-to-device copy per step); torch: a generator of the host arrays."""
    from keras_gpu_tools import backends

    x, y = np.arange(8, dtype="float32").reshape(4, 2), np.ones((4, 1), "float32")
    native = backends.get().repeated_batch((x, y))
    fit_x = FitInput.repeated((x, y), native=native).kwargs()["x"]
    if BACKEND == "tensorflow":
        assert fit_x is native
        batches = list(fit_x.take(3).as_numpy_iterator())
    elif BACKEND == "jax":
        import jax

        assert fit_x is native
        batches = [next(fit_x) for _ in range(3)]
        assert all(isinstance(a, jax.Array) for b in batches for a in b)
        assert batches[0][0] is batches[2][0]  # placed once, not put again per step
    else:
        assert native is None
        batches = [next(fit_x) for _ in range(3)]
    assert len(batches) == 3
    for bx, by in batches:
        np.testing.assert_array_equal(bx, x)
        np.testing.assert_array_equal(by, y)


def test_the_steady_state_stops_where_one_more_window_would_outlast_the_budget():
    """``out_of_time`` is asked with the last window's seconds, after each steady window, and ends the timing."""
    import keras

    from keras_gpu_tools.memory.throughput import STOP_BUDGET
    from keras_gpu_tools.memory.timed_fit import time_batch

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    asked: list[float] = []

    def out_of_time(seconds: float) -> bool:
        asked.append(seconds)
        return True  # the budget has room for no further window

    batch = (np.ones((4, 2), "float32"), np.ones((4, 1), "float32"))
    timing = time_batch(model, batch, Pace(epoch_seconds=0.01, min_windows=4, max_windows=10), out_of_time=out_of_time)
    assert timing.stopped == STOP_BUDGET and timing.windows == 1  # the first window warms up; one is kept
    assert len(asked) == 1 and asked[0] > 0.0  # asked once, with a window's own length


@pytest.mark.multibackend
def test_whole_passes_stop_after_the_warm_up_pass_where_one_more_would_outlast_the_budget():
    """A pass can be longer than what is left of the budget: the warm-up pass is then the one window, and no
    further pass starts (a third pass would outlast max_seconds)."""
    from keras_gpu_tools.memory.throughput import STOP_BUDGET
    from keras_gpu_tools.memory.timed_fit import time_fit

    model, asked, x, y = _dense(64)
    inputs = FitInput(lambda: {"x": x, "y": y, "batch_size": 16}, batches=4, whole_passes=True)
    seen: list[float] = []

    def out_of_time(seconds: float) -> bool:
        seen.append(seconds)
        return True

    pace = Pace(epoch_seconds=10.0, min_windows=2, max_windows=3)
    timing = time_fit(model, inputs, pace, out_of_time=out_of_time)
    assert timing.stopped == STOP_BUDGET and timing.windows == 1 and timing.steps == 4
    assert model.history.epoch[-1] == 1 and len(seen) == 1  # the compiling pass and the warm-up pass only
    assert timing.step_seconds > 0.0


def test_a_first_window_far_shorter_than_meant_restarts_the_fit_once_with_windows_sized_by_it():
    """A rough step from one-step epochs carries an epoch's fixed cost: windows sized by it come out short."""
    from keras_gpu_tools.memory.timed_fit import _steady

    asked = []

    def fit(epochs, k, decide):  # a fit of 1 ms steps
        asked.append(k)
        times: list[float] = []
        for _ in range(epochs):
            times.append(0.001 * k)
            if decide(times):
                break
        return times

    def stop(done, last, state):
        state["stopped"] = "known" if len(done) >= 2 else ""
        return bool(state["stopped"])

    k, windows, stopped = _steady(fit, FitInput(dict), Pace(epoch_seconds=0.1, max_windows=5), 5, stop)
    assert asked == [5, 100] and k == 100 and windows == pytest.approx([0.001, 0.001]) and stopped == "known"
