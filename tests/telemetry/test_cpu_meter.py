"""CpuMeter: this process's CPU time with its live worker processes, found without scanning all of /proc."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from keras_gpu_tools.telemetry.cpu_meter import CpuMeter, descendants

# A child that starts a grandchild, says both pids, then waits (the grandchild burns CPU when asked).
TREE = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import sys, time\\nwhile time.process_time() < float(sys.argv[1]): pass\\n"
                      "time.sleep(30)", sys.argv[1]])
print(g.pid, flush=True)
time.sleep(30)
"""


@pytest.fixture
def tree():
    procs = []

    def start(burn_seconds: float):
        child = subprocess.Popen([sys.executable, "-c", TREE, str(burn_seconds)], stdout=subprocess.PIPE, text=True)
        procs.append(child)
        grandchild = int(child.stdout.readline())
        procs.append(psutil.Process(grandchild))
        return child.pid, grandchild

    yield start
    for p in reversed(procs):
        try:
            p.kill()
        except Exception:
            pass


@pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="Linux's per-thread children files"
)
def test_descendants_are_the_children_and_grandchildren_psutil_finds(tree):
    child, grandchild = tree(0.0)
    found = descendants(os.getpid())
    assert {child, grandchild} <= set(found)
    assert set(found) == {p.pid for p in psutil.Process().children(recursive=True)}
    assert descendants(2**22 + 7) is None  # above Linux's largest pid: no such process


def test_the_workers_cpu_time_counts_as_this_process(tree):
    meter = CpuMeter()
    _, grandchild = tree(0.6)  # the grandchild burns 0.6 s of CPU while this process sleeps
    worker, deadline = psutil.Process(grandchild), time.monotonic() + 60
    while sum(worker.cpu_times()[:2]) < 0.55 and time.monotonic() < deadline:  # CPU time, however busy the host
        time.sleep(0.05)
    own = meter._own() - meter.own_start
    assert own >= 0.4, own
    assert meter.read()["process_cpu_percent"] > 0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat")
def test_system_times_are_psutils_figures_read_from_a_file_kept_open(tmp_path, monkeypatch):
    from keras_gpu_tools.telemetry import cpu_meter
    from keras_gpu_tools.telemetry.cpu_meter import SystemTimes

    # A fixed /proc/stat for both readers: the same counters, exactly, however busy the host.
    n = len(psutil.cpu_times())
    fields = " ".join(str(1000 * (i + 1) + i) for i in range(n))
    (tmp_path / "stat").write_text(f"cpu  {fields}\ncpu0 {fields}\nintr 0\n")
    with monkeypatch.context() as m:
        m.setattr(psutil, "PROCFS_PATH", str(tmp_path))
        m.setattr(cpu_meter, "STAT_PATH", str(tmp_path / "stat"))
        times = SystemTimes(psutil)
        ours, theirs = times(), psutil.cpu_times()
        assert type(ours) is type(theirs) and ours == theirs
        (tmp_path / "stat").write_text(f"cpu  {fields.replace('1000', '1500', 1)}\n")  # read again from its start
        assert times().user == psutil.cpu_times().user == ours.user + 500 / os.sysconf("SC_CLK_TCK")

    # The real file: the counters advance at most one second per CPU per second between the two reads.
    times = SystemTimes(psutil)
    t0 = time.monotonic()
    ours, theirs = times(), psutil.cpu_times()
    slack = (time.monotonic() - t0) * psutil.cpu_count() + 2 / os.sysconf("SC_CLK_TCK")
    assert type(ours) is type(theirs)
    for field in theirs._fields:
        assert abs(getattr(theirs, field) - getattr(ours, field)) <= slack, field
    later = times()
    assert sum(later) >= sum(ours)


def test_with_a_periodic_job_the_looks_for_workers_leave_the_callers_thread(monkeypatch):
    from keras_gpu_tools.telemetry import cpu_meter

    jobs = []
    meter = CpuMeter(every=lambda interval, fn, on_error: jobs.append((interval, fn)))
    assert [interval for interval, _ in jobs] == [cpu_meter.RESCAN_S]
    looks = []
    real = cpu_meter.descendants
    monkeypatch.setattr(cpu_meter, "descendants", lambda pid: (looks.append(pid), real(pid))[1])
    meter.read()  # the first reading looks itself: workers start with the first batches
    assert len(looks) == 1
    monkeypatch.setattr(cpu_meter, "RESCAN_S", 0.0)  # a look would be due at every call
    for _ in range(3):
        meter.restart()
        meter.read()
    assert len(looks) == 1  # none on the caller's thread after the first reading
    jobs[0][1]()  # the job, as the session's thread runs it
    assert len(looks) == 2
