"""free_failed_step: what a failed step's frames hold is freed, also where Keras filtered its traceback."""

import gc
import weakref

from keras.src.utils import traceback_utils

from keras_gpu_tools.memory.freeing import free_failed_step


class Activation:
    """Stands for a failed step's tensor: something large a frame holds."""


def _deepest():
    raise MemoryError("out of memory")


def _layer_call(refs):
    held = Activation()  # a local of a frame the filtered traceback leaves out
    refs.append(weakref.ref(held))
    _deepest()


def _failed_step(refs):
    """The error as Keras hands it over: its traceback filtered to the frames outside Keras.

    Keras's own filter (`traceback_utils`) keeps the frames whose files are outside Keras; here
    `_layer_call` plays the Keras frame it drops (the others are this test's).
    """
    keep = traceback_utils.include_frame
    traceback_utils.include_frame = lambda name: keep(name) and not name.endswith("test_freeing.py")
    try:
        try:
            _layer_call(refs)
        except MemoryError as e:
            frames = list(traceback_utils.traceback.walk_tb(e.__traceback__))
            tb = traceback_utils._process_traceback_frames(e.__traceback__)
            kept = [t.tb_frame for t in _walk(tb)]
            assert _layer_call.__code__ not in [f.f_code for f in kept]  # filtered out of the traceback
            assert _layer_call.__code__ in [f.f_code for f, _ in frames]
            return e.with_traceback(tb)
    finally:
        traceback_utils.include_frame = keep


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_a_frame_left_out_of_a_filtered_traceback_is_cleared_while_the_error_lives():
    refs = []
    error = _failed_step(refs)
    gc.collect()
    assert refs[0]() is not None  # the error lives, so does the dropped frame and its tensor
    free_failed_step(error, held=lambda: False)
    assert refs[0]() is None  # freed although the error is still referenced
    assert str(error) == "out of memory"  # the error itself, its message and traceback are intact
    assert [t.tb_frame.f_code.co_name for t in _walk(error.__traceback__)][-1] == "_deepest"


def test_the_frames_still_running_are_left_alone():
    marker = Activation()
    ref = weakref.ref(marker)
    try:
        _deepest()
    except MemoryError as e:
        error = e
    free_failed_step(error, held=lambda: False)  # this test's frame runs: its locals stay
    assert ref() is marker
