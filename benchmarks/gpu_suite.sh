#!/usr/bin/env bash
# Every GPU check of the project, for a machine with a GPU (CONTRIBUTING.md, "GPU runs"):
# the `gpu`-marked tests on JAX and torch, then each benchmark on JAX and torch. Results go to
# benchmarks/results/<benchmark>_<machine>.json (one file per benchmark and machine, a run per
# backend in it), logs to $LOGS (default gpu-logs/). Exits non-zero if any part fails: a test, or a
# benchmark that crashes, fails a check or misses its goal (benchmarks/README.md).
#
#   bash benchmarks/gpu_suite.sh               # tests, then benchmarks
#   bash benchmarks/gpu_suite.sh tests         # only the gpu-marked tests
#   bash benchmarks/gpu_suite.sh benchmarks    # only the benchmarks
#   bash benchmarks/gpu_suite.sh distributed   # the multi-process job tests, one GPU per process
#
# MACHINE=h200 names the result files (default: guessed from nvidia-smi, e.g. h100, h200x2).
set -u
cd "$(dirname "$0")/.."
LOGS=${LOGS:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 KGT_GPU_REPORT_DIR="$LOGS" TF_CPP_MIN_LOG_LEVEL=2
MACHINE_ARG=()
[ -n "${MACHINE:-}" ] && MACHINE_ARG=(--machine "$MACHINE")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOGS/card.txt"

FAILED=()
# Runs "$@" with a time limit of $1 seconds, its output in $LOGS/$2.log; records a failure.
part() {
    local limit=$1 name=$2
    shift 2
    echo "== $name"
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    tail -n 8 "$LOGS/$name.log"
    if [ "$rc" -ne 0 ]; then
        echo "FAILED: $name (exit $rc; log $LOGS/$name.log)"
        FAILED+=("$name")
    fi
}

tests() {
    for b in jax torch; do
        part 600 "gpu_tests_$b" env KERAS_BACKEND=$b python3 -m pytest -m gpu -q -p no:cacheprovider tests
    done
}

benchmarks() {
    for b in jax torch; do
        # float32 GEMMs keep the GPU below its power limit: steadier blocks (RESULTS.md)
        part 600 "per_step_cost_$b" env JAX_DEFAULT_MATMUL_PRECISION=highest python3 benchmarks/per_step_cost.py \
            --backend $b "${MACHINE_ARG[@]}" --width 2048 --batch 1024 --rounds 6
        part 300 "input_bound_accuracy_$b" python3 benchmarks/input_bound_accuracy.py --backend $b "${MACHINE_ARG[@]}"
        part 300 "oom_recovery_$b" python3 benchmarks/oom_recovery.py --backend $b "${MACHINE_ARG[@]}"
        part 300 "planner_$b" python3 benchmarks/planner.py --backend $b "${MACHINE_ARG[@]}"
        part 300 "sampler_cost_$b" python3 benchmarks/sampler_cost.py --backend $b "${MACHINE_ARG[@]}"
        # torch's plain fits on arrays wait for Keras's array adapter: the reference trains on one batch repeated
        part 600 "planner_throughput_$b" python3 benchmarks/planner_throughput.py --backend $b "${MACHINE_ARG[@]}" \
            --max-seconds 110 $([ "$b" = torch ] && echo --reference batch)
        part 1200 "find_speedups_$b" python3 benchmarks/find_speedups.py --backend $b "${MACHINE_ARG[@]}"
        part 300 "layer_table_cost_$b" python3 benchmarks/layer_table_cost.py --backend $b "${MACHINE_ARG[@]}"
        part 300 "layer_table_heavy_$b" python3 benchmarks/layer_table_heavy.py --backend $b "${MACHINE_ARG[@]}"
        # Keras's torch backend runs one step per call: steps_per_execution is TensorFlow's and JAX's
        if [ "$b" = jax ]; then
            part 300 "profiler_window_spe_$b" python3 benchmarks/profiler_window_spe.py --backend $b "${MACHINE_ARG[@]}"
            # a jitted step compiles once per batch shape (torch runs eager): about 250 s of compiling
            part 420 "retrace_storm_$b" python3 benchmarks/retrace_storm.py --backend $b "${MACHINE_ARG[@]}"
        fi
        part 600 "per_epoch_cost_$b" python3 benchmarks/per_epoch_cost.py --backend $b "${MACHINE_ARG[@]}" \
            --epochs 1500 --rounds 2
    done
}

distributed() {
    # One GPU per process, 4 jobs at a time, so JAX must not preallocate; needs pytest-xdist.
    part 600 distributed_jobs env KGT_JOB_GPUS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false KERAS_BACKEND=jax \
        python3 -m pytest -q -n 4 -p no:cacheprovider tests/distributed
}

case "${1:-all}" in
    tests) tests ;;
    benchmarks) benchmarks ;;
    distributed) distributed ;;
    all) tests; benchmarks ;;
    *) echo "usage: bash benchmarks/gpu_suite.sh [tests|benchmarks|distributed|all]" >&2; exit 2 ;;
esac

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu_suite: ${#FAILED[@]} part(s) failed: ${FAILED[*]}"
    exit 1
fi
echo "gpu_suite: every part passed"
