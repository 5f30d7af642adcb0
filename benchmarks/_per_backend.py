"""Runs a benchmark script once per Keras backend, each in its own process (one backend per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def run_per_backend(script: str, backends: str, argv: list[str]) -> list[dict]:
    """Runs ``script --out <tmp> *argv`` with ``KERAS_BACKEND`` set to each of ``backends`` (comma-separated).

    Returns the concatenated ``results`` of their JSON outputs; a backend whose run
    failed gives ``{"backend": ..., "error": <the end of its stderr>}``.
    """
    results = []
    for backend in backends.split(","):
        out = os.path.join(tempfile.gettempdir(), f"kgt_{os.path.basename(script)}_{backend}_{os.getpid()}.json")
        cmd = [sys.executable, os.path.abspath(script), "--out", out, *argv]
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                results.extend(json.load(f)["results"])
            os.remove(out)
        else:
            results.append({"backend": backend, "error": proc.stderr[-3000:]})
    return results


def write_json(path: str | None, doc: dict) -> None:
    """Writes ``doc`` to ``path`` (if given), making its folder."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
