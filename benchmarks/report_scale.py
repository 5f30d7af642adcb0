"""report() of large log directories: its time and peak memory against the size of the logs.

What it measures: the wall time and the peak resident memory (`ru_maxrss`) of what
`keras-gpu-tools report LOG_DIR` does (`report(log_dir)`, its text, its HTML page with every plot),
each in a fresh process, on two kinds of log directory written with the package's own `EventWriter`:

- `big`: one run of `--megabytes` MB (200 by default) of GPUUtilizationLogger samples (one GPU and
  the host, one event per sample, as a long run writes them) and InputBoundDetector windows;
- `gpus`: one sample run of `--gpus` GPUs (128) and of a quarter of them, `--gpu-samples` samples
  each: the time per GPU of both should be about the same (linear in the number of GPUs).

Goals: 200 MB in under 10 s on a 2-core CPU (a larger `--megabytes` at the same 20 MB/s); peak
memory at most twice the largest event file; the same time per GPU at both GPU counts (the larger
count at most 1.5 times the smaller's per GPU). A full run exits non-zero and names the goal
missed (of the cases it ran). `--smoke` runs tiny sizes in seconds and checks that the reports
are right and every figure was measured; it prints the goals unenforced.

Output: per case `seconds`, `peak_rss_mib`, the file sizes and counts; `seconds_per_gpu`.

    python benchmarks/report_scale.py            # the sizes above: a few minutes, 1 GB of disk
    python benchmarks/report_scale.py --smoke    # seconds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import _common

BENCHMARK = "report_scale"
BIG_SECONDS, BIG_MB = 10.0, 200.0  # the big file's goal: 200 MB in under 10 s (larger files: the same rate)
LINEAR = 1.5  # seconds per GPU at the larger count over the smaller's, at most

# The child: what `keras-gpu-tools report` does, then its time, its peak memory and a few figures.
CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    t = time.perf_counter()
    from keras_gpu_tools import report
    r = report(sys.argv[1])
    text, page = r.text(), r.html(full_page=True)
    seconds = time.perf_counter() - t
    s = r.data.series
    print(json.dumps({
        "seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "series": len(s),
        "figures": len(r.figures()),
        "points_kept_max": max((len(v.values) for v in s.values()), default=0),
        "util_stats": list(s["gpu/0/utilization_percent"].stats()) if "gpu/0/utilization_percent" in s else None,
        "text_chars": len(text),
        "html_chars": len(page),
    }))
    """
)


def _parse():
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--megabytes", type=float, default=200.0, help="size of the big event file")
    p.add_argument("--gpus", type=int, default=128)
    p.add_argument("--gpu-samples", type=int, default=300)
    p.add_argument("--cases", default="big,gpus", help="which of big, gpus to run (default: both)")
    args = p.parse_args()
    if args.smoke:
        args.megabytes, args.gpus, args.gpu_samples = 2.0, 8, 50
    return args


def sample(i: int, gpus: int = 1) -> dict[str, float]:
    """One sample of GPUUtilizationLogger: per GPU utilization, memory, power; the host's memory and CPU."""
    out: dict[str, float] = {}
    for g in range(gpus):
        out[f"gpu/{g}/utilization_percent"] = float(40 + (i * 7 + g) % 60)
        out[f"gpu/{g}/memory_used_mib"] = 20000.0 + (i % 13)
        out[f"gpu/{g}/power_watts"] = 300.0 + (i % 17)
    out.update({"host/rss_mib": 4000.0 + (i % 5), "host/cpu_percent": 101.0})
    return out


def write_big(log_dir: str, megabytes: float) -> dict:
    """A GPU run of about `megabytes` MB, and an input run with a window every 1000 samples."""
    from keras_gpu_tools.logdir.writer import EventWriter

    gpu, inp = EventWriter(os.path.join(log_dir, "gpu")), EventWriter(os.path.join(log_dir, "input"))
    path = gpu._events.path  # the local file being written
    i, target, t0, utils = 0, megabytes * 1e6, 1.7e9, []
    while True:
        values = sample(i)
        utils.append(values["gpu/0/utilization_percent"])
        gpu.scalars(values, step=i, wall_time=t0 + 0.1 * i)
        if i % 1000 == 999:
            window = {"input/steps": 1000.0, "input/wait_ms": 2.0, "input/compute_ms": 40.0, "input/other_ms": 1.0}
            inp.scalars({**window, "input/step_ms": 43.0, "throughput/steps_per_sec": 23.0}, step=i)
            if os.path.getsize(path) >= target:
                break
        i += 1
    gpu.close()
    inp.close()
    return {"events": i + 1, "bytes": os.path.getsize(path), "util": [min(utils), max(utils), utils[-1]]}


def write_gpus(log_dir: str, gpus: int, samples: int) -> int:
    from keras_gpu_tools.logdir.writer import EventWriter

    w = EventWriter(os.path.join(log_dir, "gpu"))
    for i in range(samples):
        w.scalars(sample(i, gpus), step=i, wall_time=1.7e9 + i)
    w.close()
    return os.path.getsize(w._events.path)


def measure(log_dir: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, log_dir], capture_output=True, text=True, env=dict(os.environ))
    if out.returncode != 0:
        raise SystemExit(f"report({log_dir}) failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    args = _parse()
    backend = _common.setup(args)
    out = _common.out_path(args, BENCHMARK)
    result: dict = {}
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory(prefix="kgt_report_scale_") as tmp:
        if "big" in cases:
            big = write_big(os.path.join(tmp, "big"), args.megabytes)
            result["big"] = {**big, **measure(os.path.join(tmp, "big"))}
            print(f"big: {big['bytes'] / 1e6:.1f} MB, {big['events']} events:", json.dumps(result["big"]), flush=True)
        for gpus in (max(args.gpus // 4, 1), args.gpus) if "gpus" in cases else ():
            where = os.path.join(tmp, f"gpus_{gpus}")
            size = write_gpus(where, gpus, args.gpu_samples)
            result[f"gpus_{gpus}"] = {"gpus": gpus, "bytes": size, **measure(where)}
            print(f"{gpus} GPUs:", json.dumps(result[f"gpus_{gpus}"]), flush=True)
    if "gpus" in cases:
        few, many = result[f"gpus_{max(args.gpus // 4, 1)}"], result[f"gpus_{args.gpus}"]
        result["seconds_per_gpu"] = [few["seconds"] / few["gpus"], many["seconds"] / many["gpus"]]
        print(f"seconds per GPU: {result['seconds_per_gpu']}")
    doc = {**_common.environment(backend), "args": vars(args)}
    _common.save(out, BENCHMARK, backend, {**doc, "result": result})
    print("written to", out)

    check = _common.Checks(args)
    if "big" in result:
        b = result["big"]
        stats = b["util_stats"]
        check(stats is not None and [stats[i] for i in (0, 2, 3)] == big["util"], "exact min/max/last")
        check(0 < b["points_kept_max"] <= 2049, f"points kept per tag bounded ({b['points_kept_max']})")
        check.figure("big: seconds", b["seconds"], 0.0)
        check.figure("big: peak RSS MiB", b["peak_rss_mib"], 0.0)
        limit = BIG_SECONDS * max(1.0, b["bytes"] / 1e6 / BIG_MB)
        check.goal(b["seconds"] < limit, f"{b['bytes'] / 1e6:.0f} MB in under {limit:.1f} s ({b['seconds']:.1f} s)")
        check.goal(
            b["peak_rss_mib"] * 2**20 <= 2 * b["bytes"],
            f"peak memory at most twice the file ({b['peak_rss_mib']:.0f} MiB for {b['bytes'] / 2**20:.0f} MiB)",
        )
    if "gpus" in cases:
        check(many["figures"] >= many["gpus"], f"a figure per GPU ({many['figures']})")
        few_s, many_s = result["seconds_per_gpu"]
        check.figure("seconds per GPU", many_s, 0.0)
        check.goal(
            many_s <= LINEAR * few_s,
            f"linear in GPUs: {many['gpus']} GPUs at most {LINEAR} times the seconds per GPU of {few['gpus']} "
            f"({many_s:.3f} against {few_s:.3f})",
        )
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
