"""Callbacks find each other by role (a runtime-checkable Protocol), never by class name or a loose attribute."""

import inspect
from types import SimpleNamespace

import keras_gpu_tools.callbacks as callbacks_pkg
from keras_gpu_tools.callbacks.roles import declared
from keras_gpu_tools.live.render import LiveState
from keras_gpu_tools.runtime import roles

ROLES = [obj for obj in vars(roles).values() if inspect.isclass(obj) and getattr(obj, "_is_runtime_protocol", False)]


def test_every_callback_declares_exactly_the_roles_it_plays():
    table = declared()
    public = {getattr(callbacks_pkg, n) for n in callbacks_pkg.__all__ if inspect.isclass(getattr(callbacks_pkg, n))}
    assert public <= set(table), public - set(table)
    for cls, plays in table.items():
        inherited = {r for r in ROLES if r in cls.__mro__}
        assert inherited == set(plays), (cls.__name__, inherited, plays)


def test_the_live_view_finds_callbacks_by_role():
    gpu = SimpleNamespace(timeline=[], gpus=[])
    det = SimpleNamespace(verdict=None, window_verdicts=[])
    prof = SimpleNamespace(captures=[])
    oom = SimpleNamespace(micro_batches=2)
    st = LiveState()
    st.attach([oom, prof, det, gpu])
    assert (st.gpu_logger, st.detector, st.profiler, st.oom) == (gpu, det, prof, oom)


def test_a_similar_object_without_the_role_is_not_found():
    class OOMLookalike:  # a name with "oom" in it found it before
        recoveries: list = []

    class HalfDetector:  # one threshold only
        high_threshold = 0.2

    st = LiveState()
    st.attach([OOMLookalike(), SimpleNamespace(timeline=[]), SimpleNamespace(verdict=None)])
    assert (st.gpu_logger, st.detector, st.profiler, st.oom) == (None, None, None, None)
    assert not isinstance(HalfDetector(), roles.InputThresholds)
    assert isinstance(SimpleNamespace(moderate_threshold=0.05, high_threshold=0.2), roles.InputThresholds)
    assert not isinstance(SimpleNamespace(gpus=[]), roles.GPUTimeline)


def test_the_package_callbacks_are_found_by_their_roles():
    from keras_gpu_tools import GPUUtilizationLogger, InputBoundDetector, OOMBatchSizeReducer, ProfilerWindow

    gpu, det = GPUUtilizationLogger(log_dir=None), InputBoundDetector(log_dir=None)
    prof, oom = ProfilerWindow(), OOMBatchSizeReducer()
    st = LiveState()
    st.attach([oom, prof, det, gpu])
    assert (st.gpu_logger, st.detector, st.profiler, st.oom) == (gpu, det, prof, oom)
    assert isinstance(det, roles.InputThresholds) and not isinstance(prof, roles.InputThresholds)
    assert isinstance(gpu, roles.GPUTimeline) and not isinstance(det, roles.GPUSampler)
