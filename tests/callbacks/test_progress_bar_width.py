"""Keras's progress bar with our callbacks is (nearly) as wide as plain Keras's, and our lines wrap.

Real fits with ``verbose=1``, stdout captured by capsys (no terminal: our lines wrap at 100
characters), the bar's width measured as a terminal shows it.
"""

import re
import warnings

import pytest

from keras_gpu_tools import (
    GPUUtilizationLogger,
    InputBoundDetector,
    MemoryLeakDetector,
    OOMBatchSizeReducer,
    ProfilerWindow,
)
from keras_gpu_tools.runtime.fit_output import NO_TERMINAL_WIDTH, wrap
from tests.helpers.data import regression_data
from tests.helpers.models import tiny_dense_model

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
WIDER_AT_MOST = 10  # characters our callbacks may add to the bar's widest line


def terminal_lines(text: str) -> list[str]:
    text = _ANSI.sub("", text).replace("\b", "")
    return [part for line in text.split("\n") for part in line.split("\r") if part.strip()]


def fit(callbacks, validation):
    x, y = regression_data(64, features=4)
    model = tiny_dense_model(features=4, hidden=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: the callbacks say so once
        model.fit(
            x, y, batch_size=8, epochs=4, validation_split=0.25 if validation else 0.0, verbose=1, callbacks=callbacks
        )
    for cb in callbacks:
        if isinstance(cb, ProfilerWindow):
            cb.wait_for_analysis()


def ours(log_dir):
    """Every callback of ours with epoch figures, as a user makes them (verbose: their lines at the fit's end)."""
    return [
        GPUUtilizationLogger(log_dir=log_dir, interval=0.02),
        InputBoundDetector(log_dir=log_dir, window=4, sample_every=2),
        MemoryLeakDetector(log_dir=log_dir),
        OOMBatchSizeReducer(log_dir=log_dir, verbose=1),
        ProfilerWindow(log_dir=log_dir, start_step=2, num_steps=2),
    ]


@pytest.mark.multibackend
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("validation", [False, True])
def test_the_bar_is_at_most_ten_characters_wider_and_our_lines_wrap_at_100(
    tmp_path, capsys, monkeypatch, columns, validation
):
    monkeypatch.setenv("COLUMNS", str(columns))
    fit([], validation)
    plain = terminal_lines(capsys.readouterr().out)
    fit(ours(str(tmp_path)), validation)
    lines = terminal_lines(capsys.readouterr().out)

    def widest_bar(found):
        return max(len(line) for line in found if "━" in line)

    assert widest_bar(lines) - widest_bar(plain) <= WIDER_AT_MOST, max(lines, key=len)
    printed = [line for line in lines if "━" not in line and not line.startswith("Epoch ")]
    assert any(line.startswith("InputBoundDetector: ") for line in printed)  # the verdict is there
    # (a path longer than a line is never split: it stands alone on its line)
    assert [line for line in printed if len(line) > NO_TERMINAL_WIDTH and len(line.split()) > 1] == []


def test_wrap_keeps_words_and_paths_whole_with_a_hanging_indent(capsys):
    path = "/a/very/long/" + "directory/" * 12 + "report.html"
    line = "InputBoundDetector: highly input-bound (epochs 2-3): " + "the step waits for input " * 6 + path
    text = wrap(line)
    lines = text.split("\n")
    assert len(lines) > 1 and lines[0].startswith("InputBoundDetector: ")
    assert all(part.startswith("    ") for part in lines[1:])
    assert path in lines[-1] and " ".join(text.split()) == " ".join(line.split())  # nothing split or lost
    assert all(len(part) <= NO_TERMINAL_WIDTH for part in lines if path not in part)
    assert wrap("short line") == "short line"
