"""FitInput: a timed window's steps divide a finite input's pass and hold whole calls."""

from keras_gpu_tools.memory.timed_fit import FitInput


def test_a_window_divides_the_pass_and_holds_whole_calls():
    endless = FitInput(dict)
    assert [endless.steps(k) for k in (1, 7, 40)] == [1, 7, 40]
    finite = FitInput(dict, batches=12)
    assert [finite.steps(k) for k in (1, 5, 7, 12, 100)] == [1, 4, 6, 12, 12]
    calls = FitInput(dict, batches=32, per_call=4)
    assert [calls.steps(k) for k in (1, 6, 9, 100)] == [4, 4, 8, 32]
    assert FitInput(dict, per_call=4).steps(10) == 8
    assert FitInput(dict, batches=7, per_call=2).steps(10) == 2  # no multiple of 2 divides 7: one call
    # A call of more steps than a pass runs the pass: a window of more would run past its end.
    assert [FitInput(dict, batches=3, per_call=8).steps(k) for k in (1, 10, 100)] == [3, 3, 3]


def test_an_input_that_restarts_its_workers_every_epoch_is_timed_over_whole_passes():
    assert [FitInput(dict, batches=12, whole_passes=True).steps(k) for k in (1, 5, 40)] == [12, 12, 12]
    assert FitInput(dict, whole_passes=True).steps(5) == 5  # endless: no pass to keep whole
