"""How an eager torch step on a GPU is split between the host's launches and the device, on fixed figures."""

import pytest

from keras_gpu_tools.backends.torch.step import DEVICE_BOUND_TAIL, eager_split


def test_a_device_done_right_after_the_call_waited_for_the_host():
    # A small model: 4 ms launching kernels, the last one done 0.05 ms after the call returns.
    assert eager_split(0.004, 0.00005) == (0.004, 0.00005)


def test_a_device_busy_long_after_the_call_is_the_step():
    # A large model: the launches return after 3 ms, the device works 7 ms more; they ran under its work.
    dispatch, compute = eager_split(0.003, 0.007)
    assert dispatch is None and compute == pytest.approx(0.010)


def test_the_split_adds_up_to_the_call_on_both_sides_of_the_bound():
    host = 0.002
    for tail in (0.0, host * DEVICE_BOUND_TAIL * 0.99, host * DEVICE_BOUND_TAIL, host * 3):
        dispatch, compute = eager_split(host, tail)
        assert (dispatch or 0.0) + compute == pytest.approx(host + tail)
        assert (dispatch is None) == (tail >= host * DEVICE_BOUND_TAIL)
