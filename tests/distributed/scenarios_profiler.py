"""ProfilerWindow in a job of several processes (see ``launch.py``): each function returns a JSON-ready dict."""

from __future__ import annotations

from pathlib import Path

from tests.distributed.scenarios import data_parallel, shard
from tests.helpers.models import tiny_dense_model


def profile_window(index: int, count: int, out: Path, start_step: int = 3, num_steps: int = 4, steps: int = 10) -> dict:
    """Every process profiles the same window of one data-parallel fit into one shared ``log_dir``."""
    from keras_gpu_tools import ProfilerWindow

    data_parallel()
    model = tiny_dense_model()
    x, y = shard(index, n=16 * steps)
    cb = ProfilerWindow(log_dir=str(out / "logs"), start_step=start_step, num_steps=num_steps, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    cb.wait_for_analysis()
    return {
        "captures": [
            {
                "start": c.start_step,
                "steps": c.num_steps,
                "reason": c.reason,
                "files": c.files,
                "conclusion": c.analysis.conclusion if c.analysis else None,
                "job_files": c.job_files,
                "job_mean_step_ms": c.job_mean_step_ms,
                "job_line": c.job_line(),
                "job_conclusion": c.job_analysis.conclusion if c.job_analysis else None,
            }
            for c in cb.captures
        ],
    }


def doctor(index: int, count: int, out: Path) -> dict:
    """`keras-gpu-tools doctor` inside a job of several processes, under DataParallel."""
    from keras_gpu_tools.cli import doctor

    before = doctor.run()  # no keras.distribution set yet
    data_parallel()
    return {"before": before, "report": doctor.run()}
