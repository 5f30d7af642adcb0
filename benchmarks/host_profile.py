"""Where the training thread's time goes per step, condition by condition: host_overhead.py under perf.

``host_overhead.py`` says how much host time a condition adds per step; this says
where it is spent. It runs ``host_overhead.py`` for one backend under Linux's
``perf record`` (``cpu-clock`` samples of every thread of the process, stamped on
CLOCK_MONOTONIC), with ``--windows``, which writes the bounds of every timed epoch
and the training thread's id. Each sample inside a timed epoch is attributed to
that epoch's condition, to the training thread or the others, and to its shared
object and symbol. One sample is ``1e6 / --frequency`` us of a thread's CPU time,
so the counts give us per step, per condition; the tables show each condition
against the bare fit.

``--callers`` also records kernel call chains and splits the kernel's wake-up
path (``try_to_wake_up``: the training thread waking another thread) by the first
user-space frame: ``pthread_cond_signal`` is CPython's interpreter lock handed
over (3.11: ``drop_gil``), ``sem_post`` a Python lock or queue released to a
waiter. Call chains cost the sampled process more, so compare runs made alike.

``--wakeups`` also records the wake-ups (``sched:sched_waking``, ``sched:sched_wakeup``)
and counts, per timed step, the threads the training thread wakes: on its own CPU
("local": the woken thread will preempt it), on another CPU that is running
something ("remote_busy"), or on an idle one ("remote_idle": an inter-processor
interrupt to a sleeping CPU, which in a virtual machine whose idle vCPUs halt
traps to the hypervisor, and costs the waker far more; ``wake_cost.py`` measures
it), and the wake-ups of the training thread by others.

Sampling is statistics: ``bare`` against ``bare_again`` (run both) is the noise
floor. Python frames show as the interpreter's C functions (``_PyEval_...``):
this says kernel, interpreter, framework or libc, not which Python function.
Needs ``perf`` and the right to sample the process and its kernel side (root, or
``kernel.perf_event_paranoid`` at most 1).

    KERAS_BACKEND=jax OMP_NUM_THREADS=1 python benchmarks/host_profile.py --callers \\
        --out results/host_profile_cpu_jax.json -- --rounds 15 --conditions bare,bare_again,all,all_unhooked

Everything after ``--`` goes to ``host_overhead.py`` (not ``--backends``, ``--out``, ``--windows``).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from _per_backend import write_json

WAKE_UP = "try_to_wake_up"
# A sample's first line, "tid time:" or "tid [cpu] time:" (tid right-aligned); its frames follow.
HEADER = re.compile(r"\s*\d+\s+(\[\d+\]\s+)?\d+\.\d+:")
SYMBOLS_KEPT = 60  # per condition and thread in the JSON; the rest are summed


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--frequency", type=int, default=10000, help="samples per second of a thread's CPU time")
    p.add_argument("--callers", action="store_true", help="kernel call chains: who the training thread wakes how")
    p.add_argument("--wakeups", action="store_true", help="count the training thread's wake-ups by where they land")
    p.add_argument("--top", type=int, default=12, help="symbols shown per condition")
    p.add_argument("host_overhead_args", nargs=argparse.REMAINDER, help="after --: host_overhead.py's arguments")
    args = p.parse_args()
    rest = [a for a in args.host_overhead_args if a != "--"]
    for flag in ("--backends", "--out", "--windows"):
        if flag in rest:
            p.error(f"{flag}: set by host_profile.py; leave it out of host_overhead.py's arguments")
    if args.top < 1:
        p.error(f"--top: got {args.top}; expected 1 or more symbols")
    if not 100 <= args.frequency <= 50000:
        p.error(f"--frequency: got {args.frequency}; expected 100 to 50000 samples per second")
    if shutil.which("perf") is None:
        p.error("perf: not found on PATH; install Linux perf (linux-tools) to profile")
    args.host_overhead_args = rest
    return args


def _record(args, tmp: str) -> tuple[str, dict]:
    data, windows = os.path.join(tmp, "perf.data"), os.path.join(tmp, "windows.json")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_overhead.py")
    # The frequency on the event itself: a global -F would sample the tracepoints too.
    cmd = ["perf", "record", "-q", "-e", f"cpu-clock/freq={args.frequency}/", "-k", "mono", "-o", data]
    cmd += ["-g"] if args.callers else []
    cmd += ["-e", "sched:sched_waking", "-e", "sched:sched_wakeup"] if args.wakeups else []
    cmd += ["--", sys.executable, script, "--windows", windows, *args.host_overhead_args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(windows):
        sys.exit(
            f"host_profile: perf record or host_overhead.py failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    print(proc.stdout[proc.stdout.find("\n") :].strip())  # host_overhead.py's own table
    with open(windows) as f:
        return data, json.load(f)


def _samples(data: str, wakeups: list):
    """(tid, time, frames) per cpu-clock sample, frames (symbol, object) leaf first; wake-ups go to ``wakeups``.

    A wake-up is (waker tid, time, woken tid, where): "local" (the woken thread goes to
    the waker's CPU), "remote_busy" (to another CPU, which is running something) or
    "remote_idle" (to an idle CPU). The last is told by its absence: the kernel
    hands such a wake-up to the idle CPU itself, whose ``sched_wakeup`` then fires
    in the idle task, outside this recording of one process; every other
    ``sched_wakeup`` fires in the waker, right after its ``sched_waking``.
    """
    fields = ["-F", "sw:tid,time,ip,sym,dso", "-F", "trace:tid,cpu,time,event,trace"]
    proc = subprocess.Popen(
        ["perf", "script", "-i", data, *fields, "--ns"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    waking: dict = {}  # waker tid -> (time, woken tid, waker CPU) of its last sched_waking, not yet matched
    head, frames = None, []
    for line in proc.stdout:
        if not line.strip():
            continue
        if not HEADER.match(line):  # a frame of the sample's call chain
            frames.append(_frame(line))
            continue
        if head:
            yield (*head, frames)
        head, frames = None, []
        parts = line.split()
        if len(parts) > 3 and parts[3].startswith("sched:"):  # "tid [cpu] time: sched:...: ... pid=N ... target_cpu=C"
            found = dict(f.split("=", 1) for f in parts if "=" in f)
            waker, woken, cpu = int(parts[0]), int(found.get("pid", -1)), int(parts[1].strip("[]"))
            last = waking.pop(waker, None)
            if parts[3] == "sched:sched_waking:":
                if last is not None:  # the previous one had no sched_wakeup here
                    wakeups.append((waker, last[0], last[1], "remote_idle"))
                waking[waker] = (float(parts[2].rstrip(":")), woken, cpu)
            elif last is not None and last[1] == woken:
                where = "local" if int(found.get("target_cpu", -1)) == last[2] else "remote_busy"
                wakeups.append((waker, last[0], woken, where))
            elif last is not None:
                waking[waker] = last
            continue
        head = (int(parts[0]), float(parts[1].rstrip(":")))  # "tid time:" (+ the leaf frame without call chains)
        if len(parts) > 2:
            frames.append(_frame(line.split(None, 2)[2]))
    if head:
        yield (*head, frames)
    for waker, (t, woken, _) in waking.items():
        wakeups.append((waker, t, woken, "remote_idle"))
    proc.wait()


def _frame(text: str) -> tuple[str, str]:
    """("symbol", "object") from perf script's "ADDRESS symbol+off (/path/object)"."""
    text = text.strip().split(None, 1)[-1]
    symbol, _, obj = text.rpartition(" (")
    return symbol.split("+0x")[0].strip() or "[unknown]", os.path.basename(obj.rstrip(")"))


class TimedEpochs:
    """The timed epochs of ``--windows``: which one a moment falls in, and how many steps a condition timed."""

    def __init__(self, windows: dict):
        self.spans = sorted((begin, end, name, tid) for name, tid, begin, end in windows["windows"])
        self.starts = [s[0] for s in self.spans]
        epochs = collections.Counter(s[2] for s in self.spans)
        self.steps = {name: n * windows["steps"] for name, n in epochs.items()}

    def at(self, t: float) -> tuple[str, int] | None:
        """(condition, training thread id) of the timed epoch running at ``t``, or None between them."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0 or t > self.spans[i][1]:
            return None
        return self.spans[i][2], self.spans[i][3]


def count_wakeups(wakeups: list, epochs: TimedEpochs) -> dict:
    """Per condition, per timed step: the training thread's wake-ups of others, by where they go, and its own."""
    count = collections.defaultdict(collections.Counter)
    for waker, t, woken, where in wakeups:
        found = epochs.at(t)
        if found is None:
            continue
        name, training = found
        if waker == training:
            count[name][f"wakes_{where}"] += 1
        elif woken == training:
            count[name][f"woken_{where}"] += 1
    return {
        name: {key: round(n / epochs.steps[name], 3) for key, n in sorted(counter.items())}
        for name, counter in count.items()
    }


def attribute(samples, epochs: TimedEpochs, frequency: int) -> dict:
    """us per step by condition: training thread and other threads, by object and symbol; wake-up callers."""
    count = collections.defaultdict(collections.Counter)
    for tid, t, frames in samples:
        found = epochs.at(t)
        if found is None or not frames:
            continue
        name, training = found
        who = "training" if tid == training else "other"
        symbol, obj = frames[0]
        count[name][(who, "object", obj)] += 1
        count[name][(who, "symbol", f"{symbol} ({obj})")] += 1
        if who == "training" and len(frames) > 1 and any(f[0] == WAKE_UP for f in frames[:3]):  # --callers
            caller = next((f for f in frames if f[1] != "[kernel.kallsyms]"), ("[none]", ""))
            count[name][(who, "wakes_via", f"{caller[0]} ({caller[1]})")] += 1
    per_sample = 1e6 / frequency
    out = {}
    for name, counter in count.items():
        steps = epochs.steps[name]
        table: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
        for (who, kind, key), n in counter.items():
            table[who][kind][key] = round(n * per_sample / steps, 3)
        out[name] = {"timed_steps": steps}
        for who, kinds in table.items():
            out[name][who] = {"total": round(sum(kinds["object"].values()), 2), **kinds}
            out[name][who]["symbol"] = largest(kinds["symbol"])
    return out


def largest(parts: dict, keep: int = SYMBOLS_KEPT) -> dict:
    """The ``keep`` largest of ``parts`` (us per step by name), the rest summed as "(the rest)"."""
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:keep])
    if len(ranked) > keep:
        out["(the rest)"] = round(sum(v for _, v in ranked[keep:]), 3)
    return out


def _report(result: dict, top: int) -> None:
    base = result.get("bare")
    for name, row in sorted(result.items(), key=lambda kv: kv[1] is not base):
        for who in ("training", "other"):
            part, ref = row.get(who, {}), (base or {}).get(who, {})
            added = "" if base is None else f" ({part.get('total', 0) - ref.get('total', 0):+.1f} against bare)"
            print(f"\n{name}, {who} thread{'s' if who == 'other' else ''}: {part.get('total', 0):.1f} us/step{added}")
            for kind in ("object", "symbol", "wakes_via") if who == "training" else ("object",):
                mine, theirs = part.get(kind, {}), ref.get(kind, {})
                if row is base:  # the largest parts; elsewhere the largest differences to them
                    keys = sorted(mine, key=lambda k: -mine[k])
                else:
                    keys = sorted(set(mine) | set(theirs), key=lambda k: -abs(mine.get(k, 0) - theirs.get(k, 0)))
                for key in keys[: top if kind == "symbol" else 6]:
                    print(
                        f"  {kind:9s} {mine.get(key, 0):7.2f}  {mine.get(key, 0) - theirs.get(key, 0):+6.2f}  {key[:90]}"
                    )


def main():
    args = _parse()
    with tempfile.TemporaryDirectory(prefix="kgt_host_profile_") as tmp:
        data, windows = _record(args, tmp)
        epochs, found = TimedEpochs(windows), []
        result = attribute(_samples(data, found), epochs, args.frequency)
        wakeups = count_wakeups(found, epochs) if args.wakeups else {}
    if not result:
        sys.exit("host_profile: no sample fell in a timed epoch (perf script found none; is perf allowed to read it?)")
    _report(result, args.top)
    for name, row in wakeups.items():
        result.setdefault(name, {})["wakeups_per_step"] = row
        print(f"{name:22s} wake-ups per step: {row}")
    doc = {
        "what": "us per timed step of sampled CPU time, by condition, thread, shared object and symbol",
        "backend": os.environ.get("KERAS_BACKEND", "keras's default"),
        "frequency": args.frequency,
        "callers": args.callers,
        "wakeups": args.wakeups,
        "host_overhead_args": args.host_overhead_args,
        "conditions": result,
    }
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
