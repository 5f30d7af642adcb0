"""What waking a sleeping thread costs the waker, on its own CPU and on another: a property of the machine.

Two processes pass a byte back and forth over pipes, 20000 times, first both pinned
to one CPU (each wake-up is local: the woken process runs when the waker blocks)
and then to two CPUs (each wake-up is remote: the other CPU is idle, and waking it
takes an inter-processor interrupt). Reports the CPU time (user + system) each
process spends per round trip, the fastest of ``--rounds``. On bare metal the two
are close; in a virtual machine whose idle vCPUs halt at once (no halt polling), a
remote wake-up traps to the hypervisor, and the waker pays for it. That is what a
thread added to a training process can cost on such a machine: if it changes where
Keras's and the framework's threads are woken, not how often (``host_profile.py
--wakeups``).

    python benchmarks/wake_cost.py --out results/wake_cost_cpu.json

Linux only (``os.sched_setaffinity``); needs two CPUs.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from _per_backend import write_json


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--trips", type=int, default=20000, help="round trips per measurement")
    p.add_argument("--rounds", type=int, default=5, help="measurements per placement; the fastest is kept")
    args = p.parse_args()
    if args.trips < 100 or args.rounds < 1:
        p.error(f"--trips {args.trips} / --rounds {args.rounds}: expected at least 100 trips and 1 round")
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        p.error("needs Linux and at least two CPUs this process may run on")
    return args


def _cpu_seconds() -> float:
    return time.process_time()  # user + system, to the nanosecond (os.times() counts 10 ms ticks)


def ping_pong(cpus: tuple[int, int], trips: int) -> tuple[float, float, float]:
    """us per round trip: (the parent's CPU, the child's CPU, wall), the parent on cpus[0], the child on cpus[1]."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: echo every byte back, then report its own CPU time
        try:
            os.sched_setaffinity(0, {cpus[1]})
            start = _cpu_seconds()
            for _ in range(trips):
                os.read(to_child, 1)
                os.write(from_child, b"x")
            os.write(report_w, repr(_cpu_seconds() - start).encode())
        finally:
            os._exit(0)
    try:
        os.sched_setaffinity(0, {cpus[0]})
        start, wall = _cpu_seconds(), time.perf_counter()
        for _ in range(trips):
            os.write(from_parent, b"x")
            os.read(to_parent, 1)
        parent, wall = _cpu_seconds() - start, time.perf_counter() - wall
        child = float(os.read(report_r, 64).decode())
    finally:  # closed pipes end a child left waiting (end of file, then a broken pipe)
        for fd in (to_child, from_parent, to_parent, from_child, report_r, report_w):
            os.close(fd)
        os.waitpid(pid, 0)
    return 1e6 * parent / trips, 1e6 * child / trips, 1e6 * wall / trips


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def main():
    args = _parse()
    allowed = sorted(os.sched_getaffinity(0))
    placements = {"local (one CPU)": (allowed[0], allowed[0]), "remote (two CPUs)": (allowed[0], allowed[1])}
    results = {}
    try:
        for name, cpus in placements.items():
            runs = [ping_pong(cpus, args.trips) for _ in range(args.rounds)]
            parent, child, wall = min(runs, key=lambda r: r[0] + r[1])
            results[name] = {
                "cpus": list(cpus),
                "parent_cpu_us_per_trip": round(parent, 2),
                "child_cpu_us_per_trip": round(child, 2),
                "wall_us_per_trip": round(wall, 2),
            }
            print(f"{name:18s} per round trip: CPU parent {parent:6.2f} us, child {child:6.2f} us; wall {wall:6.2f} us")
    finally:
        os.sched_setaffinity(0, allowed)
    doc = {
        "what": "CPU time per pipe round trip between two processes, on one CPU and on two",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        # How idle CPUs sleep: with halt polling off, an idle vCPU halts at once.
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "cpuidle_governor": _read("/sys/devices/system/cpu/cpuidle/current_governor"),
        "guest_halt_poll_ns": _read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        "trips": args.trips,
        "results": results,
    }
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
