"""The argument checks every callback uses (keras_gpu_tools/runtime/validation.py)."""

import math
import os
import pathlib
import re

import numpy as np
import pytest

from keras_gpu_tools.runtime import validation as v


def raises(error, name, value, *more):
    """pytest.raises for a Keras-style message naming `name` and `value`."""
    pattern = re.escape(f"Invalid value for argument `{name}`. Received: {name}={value!r}")
    for fragment in more:
        pattern += ".*" + re.escape(fragment)
    return pytest.raises(error, match=pattern)


# -- numbers ---------------------------------------------------------------------------
def test_check_int():
    assert v.check_int("n", 3, low=1) == 3 and type(v.check_int("n", np.int64(3), low=1)) is int
    assert v.check_int("n", None, low=1, allow_none=True) is None
    with raises(ValueError, "n", 0, "Expected a positive integer."):
        v.check_int("n", 0, low=1)
    with raises(ValueError, "n", 4, "Expected an integer >= 1 and <= 3."):
        v.check_int("n", 4, low=1, high=3)
    for bad in (True, 2.5, "3", None, np.bool_(True)):
        with raises(ValueError, "n", bad):
            v.check_int("n", bad, low=0)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e30, 0, -1, True, "fast", None, np.float64("inf")])
def test_check_number_rejects(bad):
    with raises(ValueError, "interval", bad, "Expected a finite number of seconds > 0 and <= 3600."):
        v.check_number("interval", bad, low=0, high=3600, exclusive_low=True, what="number of seconds")


def test_check_number_accepts_and_converts():
    assert v.check_number("x", np.float32(0.5), low=0, high=1) == 0.5
    assert type(v.check_number("x", 2, low=0)) is float
    assert v.check_number("x", None, low=0, allow_none=True) is None
    assert v.check_number("x", math.inf, low=0, finite=False) == math.inf
    with raises(ValueError, "x", 1, "Expected a finite number > 0 and < 1."):
        v.check_number("x", 1, low=0, high=1, exclusive_low=True, exclusive_high=True)


# -- flags and choices -------------------------------------------------------------------
def test_check_bool():
    assert v.check_bool("pcie", True) is True and v.check_bool("pcie", np.bool_(False)) is False
    for bad in ("abc", "False", 1, 0, None, 1.0):
        with raises(TypeError, "pcie", bad, "Expected True or False."):
            v.check_bool("pcie", bad)


def test_check_verbose():
    assert [v.check_verbose("verbose", x) for x in (0, 1, 2, True, False, np.int64(2))] == [0, 1, 2, 1, 0, 2]
    for bad in (3, -1, "auto", "loud", 1.0, None):
        with raises(ValueError, "verbose", bad, "Expected 0, 1, 2 or a bool."):
            v.check_verbose("verbose", bad)
    with raises(ValueError, "verbose", 2, "Expected 0, 1 or a bool."):
        v.check_verbose("verbose", 2, max_level=1)


def test_check_choice():
    assert v.check_choice("mode", "split", ("accumulate", "split")) == "split"
    with raises(ValueError, "mode", "halve", "Expected one of 'accumulate', 'split'."):
        v.check_choice("mode", "halve", ("accumulate", "split"))
    with raises(ValueError, "enabled", 1):  # 1 == True, but it is not True
        v.check_choice("enabled", 1, ("auto", True, False))
    with raises(ValueError, "mode", ["split"]):  # unhashable: no TypeError from `in`
        v.check_choice("mode", ["split"], ("accumulate", "split"))


def test_check_choices():
    assert v.check_choices("ignore", ("a",), ("a", "b")) == ["a"]
    with raises(TypeError, "ignore", "a", "Expected a list of values from ['a', 'b']."):
        v.check_choices("ignore", "a", ("a", "b"))
    with raises(ValueError, "ignore", ["c"], "'c' is not one of them", "['a', 'b']"):
        v.check_choices("ignore", ["c"], ("a", "b"))


def test_check_callable():
    assert v.check_callable("display", None) is None and v.check_callable("display", print) is print
    with raises(TypeError, "display", "html"):
        v.check_callable("display", "html")


# -- paths -------------------------------------------------------------------------------
def test_check_log_dir(tmp_path):
    assert v.check_log_dir("log_dir", tmp_path) == str(tmp_path)
    assert v.check_log_dir("log_dir", str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert v.check_log_dir("log_dir", None) is None
    assert v.check_log_dir("log_dir", "gs://bucket/logs") == "gs://bucket/logs"
    with raises(ValueError, "log_dir", None, "Expected a directory"):
        v.check_log_dir("log_dir", None, allow_none=False)
    with raises(TypeError, "log_dir", b"logs", "bytes", "os.fsdecode"):
        v.check_log_dir("log_dir", b"logs")
    with raises(TypeError, "log_dir", 3, "Expected a path"):
        v.check_log_dir("log_dir", 3)
    with raises(ValueError, "log_dir", ""):
        v.check_log_dir("log_dir", "")
    with raises(ValueError, "log_dir", "a\0b", "NUL"):
        v.check_log_dir("log_dir", "a\0b")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with raises(ValueError, "log_dir", str(blocker), "which is a file"):
        v.check_log_dir("log_dir", blocker)
    with raises(ValueError, "log_dir", str(blocker / "sub"), "is not a writable directory"):
        v.check_log_dir("log_dir", blocker / "sub")


def test_check_log_dir_rejects_a_pathlike_of_bytes():
    class BytesPath:
        def __fspath__(self):
            return b"logs"

    with pytest.raises(TypeError, match=r"Invalid value for argument `log_dir`.*bytes"):
        v.check_log_dir("log_dir", BytesPath())


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_check_log_dir_unwritable_parent(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with raises(ValueError, "log_dir", str(locked / "logs"), f"{str(locked)!r} is not a writable directory"):
            v.check_log_dir("log_dir", locked / "logs")
    finally:
        locked.chmod(0o700)


def test_tensorboard_module_keeps_check_log_dir(tmp_path):
    from keras_gpu_tools.logdir import writer as tensorboard

    assert tensorboard.check_log_dir(tmp_path) == str(tmp_path)
    with pytest.raises(TypeError, match="`--logdir`"):
        tensorboard.check_log_dir(3, "--logdir")


@pytest.mark.parametrize("bad", ["", ".", "..", "a\0b", "a" + os.sep + "b", " gpu", "gpu\n", "gpu "])
def test_check_run_name_rejects(bad):
    with raises(ValueError, "run_name", bad):
        v.check_run_name("run_name", bad)


def test_check_run_name():
    assert v.check_run_name("run_name", "gpu-2") == "gpu-2"
    with raises(TypeError, "run_name", 3, "Expected a non-empty directory name"):
        v.check_run_name("run_name", 3)
    if os.altsep:
        with raises(ValueError, "run_name", "a" + os.altsep + "b"):
            v.check_run_name("run_name", "a" + os.altsep + "b")


def test_check_run_dir(tmp_path):
    assert v.check_run_dir(str(tmp_path), "gpu") == str(tmp_path / "gpu")
    assert v.check_run_dir(None, "gpu") is None
    (tmp_path / "gpu").mkdir()
    assert v.check_run_dir(str(tmp_path), "gpu") == str(tmp_path / "gpu")
    (tmp_path / "input").write_text("x")
    pattern = re.escape(f"log_dir={str(tmp_path)!r}, run_name='input'") + ".*" + re.escape(str(tmp_path / "input"))
    with pytest.raises(ValueError, match=r"Invalid value for arguments `log_dir` and `run_name`.*" + pattern):
        v.check_run_dir(str(tmp_path), "input")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="run_name='dangling'"):
        v.check_run_dir(str(tmp_path), "dangling")


# -- collections -------------------------------------------------------------------------
def test_check_pairs():
    assert v.check_pairs("windows", [(5, 2), [0, np.int64(1)]]) == [(5, 2), (0, 1)]
    assert v.check_pairs("windows", ((i, 1) for i in range(2))) == [(0, 1), (1, 1)]
    assert v.check_pairs("cc", None, allow_none=True) is None
    with raises(TypeError, "windows", 5, "Expected a list of (start_step, num_steps) pairs."):
        v.check_pairs("windows", 5)
    with raises(TypeError, "windows", "ab"):
        v.check_pairs("windows", "ab")
    with raises(ValueError, "windows", [(1, 2, 3)], "entry (1, 2, 3) is not a pair"):
        v.check_pairs("windows", [(1, 2, 3)])
    with raises(ValueError, "windows", [5], "entry 5 is not a pair"):
        v.check_pairs("windows", [5])
    with raises(ValueError, "windows", ["ab"], "entry 'ab' is not a pair"):
        v.check_pairs("windows", ["ab"])
    with raises(ValueError, "windows", [(0, 0)], "num_steps=0 in (0, 0). Expected an integer >= 1."):
        v.check_pairs("windows", [(0, 0)])
    with raises(ValueError, "windows", [(0.5, 1)], "start_step=0.5"):
        v.check_pairs("windows", [(0.5, 1)])
    with raises(ValueError, "windows", [], "at least one"):
        v.check_pairs("windows", [], non_empty=True)
    with raises(ValueError, "cc", [(8, -1)], "minor=-1 in (8, -1)"):
        v.check_pairs("cc", [(8, -1)], fields=("major", "minor"), lows=(0, 0))


def test_check_devices():
    assert v.check_devices("devices", None) is None
    assert v.check_devices("devices", (0, "GPU-1")) == [0, "GPU-1"]
    with raises(TypeError, "devices", "0"):
        v.check_devices("devices", "0")
    with raises(TypeError, "devices", 0):
        v.check_devices("devices", 0)
    for bad in (-1, 0.5, "", True):
        with pytest.raises(ValueError, match=re.escape(f"entry {bad!r}")):
            v.check_devices("devices", [bad])


def test_no_framework_import():
    # The package imports Keras in its __init__; the module itself must not (it is loaded by every callback).
    import ast

    tree = ast.parse(pathlib.Path(v.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"keras", "tensorflow", "jax", "torch", "numpy"}, imported
