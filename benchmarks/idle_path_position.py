"""Where on the reducer's idle step a little Python costs a lot (JAX on the CPU, Keras's batch-end thread on).

A diagnostic. ``gpu_overhead_blocks.py --dispatch keras`` put most of the six
callbacks' per-step cost on JAX with Keras's batch-end thread on in the OOM
reducer's idle step, which does little: it fetches the batch, compares its
shapes with those that ran whole (``batch_signature``, about 0.4 us alone) and
runs Keras's compiled step. Each variant below replaces that step (the reducer
alone in the fit, ``gpu_overhead_blocks.py``'s harness and measure, each
variant in its own process) with:

- ``keras_step``: fetch, then Keras's compiled step (no check at all);
- ``length_check``: fetch, one leading-dimension test, the step;
- ``python_before_fetch``: about 0.5 us of plain Python, then fetch and step;
- ``python_after_fetch``: fetch, the same Python, then the step;
- ``signature_after_fetch``: fetch, ``batch_signature`` and its comparison, the step;
- ``package``: the package's own idle step.

    KERAS_BACKEND=jax python benchmarks/idle_path_position.py --rounds 8 --out results/idle_path_position_jax_cpu.json

Not an exact path of the package (no variant but ``package`` is one): none
recovers from an out-of-memory error. Prints each variant's on/off and A/A in
microseconds a step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = (
    "keras_step",
    "length_check",
    "python_before_fetch",
    "python_after_fetch",
    "signature_after_fetch",
    "package",
)


def _plain_python():
    """About half a microsecond of interpreter work that touches nothing (a loop, a list, a tuple, a hash)."""
    for _ in range(12):
        pass
    x = [1, 2, 3]
    return hash(((1, 2), (x[0], 4)))


def _patch(variant: str) -> None:
    """Replaces the JAX backend's reducer step with ``variant`` (one batch per call)."""
    from keras_gpu_tools.backends.jax import backend as kj
    from keras_gpu_tools.runtime import keras_internals as ki
    from keras_gpu_tools.runtime.batches import batch_signature

    if variant == "package":
        return

    def reducer_call(self, one, idle, runner, steps_per_execution, replicas=1):
        step = ki.jax_batch_step(runner.original)
        if step is None or steps_per_execution != 1:
            raise SystemExit("the variants need Keras's one-batch JAX step (steps_per_execution=1)")
        size = None

        def keras_step(state, iterator):
            return step(state, next(iterator))

        def length_check(state, iterator):
            nonlocal size
            batch = next(iterator)
            if size is None:
                size = len(batch[0])
            if len(batch[0]) == size:
                return step(state, batch)
            return one(batch, state)

        def python_before_fetch(state, iterator):
            _plain_python()
            return step(state, next(iterator))

        def python_after_fetch(state, iterator):
            batch = next(iterator)
            _plain_python()
            return step(state, batch)

        def signature_after_fetch(state, iterator):
            batch = next(iterator)
            if batch_signature(batch) == idle.signature:
                return step(state, batch)
            return one(batch, state)

        return locals()[variant]

    kj.JaxBackend.reducer_call = reducer_call


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # one variant, in a child process
    p.add_argument(
        "--no-batch-end-thread",
        action="store_true",
        help="the control: Keras runs the batch-end hooks on the training thread (no thread pool)",
    )
    args, rest = p.parse_known_args()
    here = os.path.dirname(os.path.abspath(__file__))
    if args.variant:
        _patch(args.variant)
        sys.path.insert(0, here)
        import gpu_overhead_blocks

        # --out, --rounds and the thread switch are this parser's too: handed on
        sys.argv = ["gpu_overhead_blocks.py", *rest, "--rounds", str(args.rounds)]
        sys.argv += ["--out", args.out] if args.out else []
        sys.argv += ["--no-batch-end-thread"] if args.no_batch_end_thread else []
        gpu_overhead_blocks.main()
        return
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        p.error(f"--variants: unknown {sorted(unknown)}; expected names from {', '.join(VARIANTS)}")
    blocks = "--width 32 --layers 1 --batch 32 --steps 3000 --block 100 --epochs 3 --dispatch keras"
    doc = {
        "what": __doc__.split("\n\n")[0],
        "rounds": args.rounds,
        "keras_batch_end_thread": not args.no_batch_end_thread,
        "variants": {},
    }
    for variant in args.variants.split(","):
        out = os.path.join(tempfile.gettempdir(), f"kgt_idle_path_{variant}_{os.getpid()}.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--variant",
            variant,
            "--out",
            out,
            "--rounds",
            str(args.rounds),
        ]
        cmd += [*blocks.split(), "--callbacks", "OOMBatchSizeReducer"]
        cmd += ["--no-batch-end-thread"] if args.no_batch_end_thread else []
        env = dict(os.environ, KERAS_BACKEND="jax", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{proc.stderr[-3000:]}")
        with open(out) as f:
            found = json.load(f)
        os.remove(out)
        doc["variants"][variant] = {
            k: found[k] for k in ("off_step_ms_median", "all_six_on_over_off", "aa_off_over_off")
        }
        on, aa = found["all_six_on_over_off"]["added_us_per_step"], found["aa_off_over_off"]["added_us_per_step"]
        print(
            f"{variant:22s} on/off {on['mean']:+6.2f} {on['median']:+6.2f} {on['trimmed_mean_10pct']:+6.2f} us"
            f"   A/A {aa['mean']:+6.2f} {aa['median']:+6.2f} {aa['trimmed_mean_10pct']:+6.2f} (mean, median, trimmed)",
            flush=True,
        )
        if args.out:  # after every variant: a run cut short keeps what it measured
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
