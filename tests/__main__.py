"""Runs the suite on every Keras backend, one pytest session each, and reports each.

    python -m tests -m "not slow"        # README.md's test command: the fast set, every backend
    python -m tests -m slow              # the rest (CI runs both)
    python -m tests                      # every test, every backend
    python -m tests --backends jax -x    # one backend; other arguments go to pytest

Keras fixes its backend at import, so each backend is a pytest process of its own:

- ``tensorflow``: every test;
- ``tensorflow, allocator stats``: the tests that read TensorFlow's CPU allocator statistics, in
  a session whose allocator keeps them (``tests/helpers/session.py``);
- ``jax`` and ``torch``: the tests marked ``multibackend``.

Every session runs, whatever an earlier one gave, so one backend's failure never hides another's
results. With pytest-xdist installed the large sessions run on ``--workers`` processes (default:
the CPU count, at most 4), a test file to a worker. The exit status is non-zero if any session
failed; the last line counts the tests of all sessions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tests.helpers.session import ALLOCATOR_STATS, files_marked

BACKENDS = ("tensorflow", "jax", "torch")
#: Sessions this small start faster than a worker pool.
SMALL = (ALLOCATOR_STATS,)
NO_TESTS = 5  # pytest's exit status when no test was collected or selected
SUMMARY = re.compile(r"^=+ (.*\b(?:passed|failed|errors?|skipped|deselected|no tests ran)\b.*) in [0-9.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")


@dataclass
class Session:
    name: str
    backend: str
    marks: str | None  # the session's own mark expression, and-ed with the user's
    rc: int = -1
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    summary: str = ""


def sessions(backends: list[str]) -> list[Session]:
    out = []
    for b in backends:
        if b == "tensorflow":
            out.append(Session("tensorflow", b, None))
            out.append(Session("tensorflow, allocator stats", b, ALLOCATOR_STATS))
        else:
            out.append(Session(b, b, "multibackend"))
    return out


def mark_expression(own: str | None, user: str | None) -> str | None:
    if own and user:
        return f"{own} and ({user})"
    return own or user


def run(s: Session, user_marks: str | None, workers: int, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pytest"]
    marks = mark_expression(s.marks, user_marks)
    if marks:
        cmd += ["-m", marks]
    if workers > 1 and s.marks not in SMALL:
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    cmd += args
    if s.marks in SMALL and not any(os.path.exists(a.split("::")[0]) for a in args):
        # Collecting the other files would import every test module only to deselect its tests.
        cmd += [os.path.relpath(f) for f in files_marked(s.marks)]
    env = dict(os.environ, KERAS_BACKEND=s.backend)
    print(f"\n== {s.name}: KERAS_BACKEND={s.backend} {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            found = SUMMARY.match(line.rstrip())
            if found:
                s.summary = found.group(1)
                s.counts = {("error" if k.startswith("error") else k): int(n) for n, k in COUNT.findall(s.summary)}
    s.rc = proc.returncode
    s.seconds = time.monotonic() - t0
    s.rc, s.summary = settled(s.rc, s.summary, user_marks)


def settled(rc: int, summary: str, user_marks: str | None) -> tuple[int, str]:
    """A session's exit status and summary, where the user's marks selected none of its tests.

    ``-m slow`` selects no test of the allocator session: nothing failed, so it is reported as
    such. Without the user's marks, no test collected is still a failure.
    """
    if rc == NO_TESTS and user_marks:
        return 0, f"no test of this session matches -m {user_marks!r}"
    return rc, summary


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests", description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    cpus = os.cpu_count() or 1
    p.add_argument("--workers", type=int, default=min(cpus, 4), help="pytest-xdist workers (default: %(default)s)")
    p.add_argument("-m", dest="marks", default=None, help="a mark expression, and-ed with each session's own")
    opts, args = p.parse_known_args(argv)
    backends = [b.strip() for b in opts.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        p.error(f"--backends: unknown backend(s) {unknown}; expected some of {list(BACKENDS)}")
    workers = opts.workers if importlib.util.find_spec("xdist") else 1
    if workers < 1:
        p.error(f"--workers: expected at least 1, received {opts.workers}")
    runs = sessions(backends)
    for s in runs:
        run(s, opts.marks, workers, args)
    print("\n== every session")
    totals: dict[str, int] = {}
    for s in runs:
        ok = s.rc == 0
        print(f"{s.name:<30} {'ok    ' if ok else f'FAILED (exit {s.rc})'} {s.seconds:7.0f} s  {s.summary}")
        for k, n in s.counts.items():
            totals[k] = totals.get(k, 0) + n
    failed = totals.get("failed", 0) + totals.get("error", 0)
    if any(s.rc != 0 for s in runs) and not failed:
        failed = sum(s.rc != 0 for s in runs)  # a session that stopped before its summary
    print(f"tests: {totals.get('passed', 0)} passed, {failed} failed, {totals.get('skipped', 0)} skipped")
    return 1 if any(s.rc != 0 for s in runs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
