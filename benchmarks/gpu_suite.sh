#!/usr/bin/env bash
# Every GPU check of the project in one go, for a GPU machine
# (CONTRIBUTING.md, "GPU runs"): gpu-marked tests on JAX and torch, then the
# benchmarks. Results land in $OUT (or ./gpu-results).
#   bash benchmarks/gpu_suite.sh tests        # the tests
#   bash benchmarks/gpu_suite.sh benchmarks   # the benchmarks
#   bash benchmarks/gpu_suite.sh distributed  # issue 11 on a machine of several GPUs
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGT_GPU_REPORT_DIR="$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/card.txt"
KERAS_BACKEND=jax python3 -c "import jax, torch, keras; print('keras', keras.__version__, 'jax', jax.__version__, 'torch', torch.__version__)" | tee -a "$OUT/card.txt"
case "${1:-tests}" in
tests)
  for b in jax torch; do
    KERAS_BACKEND=$b timeout 280 python3 -m pytest -m gpu -s -q -p no:cacheprovider --disable-warnings tests 2>&1 \
      | tee "$OUT/gpu_tests_$b.log" | grep -E "FIGURES|passed|failed|Error|assert" | tail -30
  done
  ;;
benchmarks)
  for b in jax torch; do
    KERAS_BACKEND=$b timeout 150 python3 benchmarks/gpu_logger_overhead.py --width 4096 --batch 2048 --steps 600 --repeats 7 \
      --out "$OUT/logger_overhead_$b.json" 2>&1 | tail -1
  done
  [ -f benchmarks/input_bound_overhead.py ] && KERAS_BACKEND=jax timeout 150 python3 benchmarks/input_bound_overhead.py --out "$OUT/input_overhead_jax.json" 2>&1 | tail -12
  [ -f benchmarks/input_bound_accuracy.py ] && KERAS_BACKEND=jax timeout 150 python3 benchmarks/input_bound_accuracy.py --out "$OUT/input_accuracy_jax.json" 2>&1 | tail -16
  [ -f benchmarks/oom_recovery.py ] && for b in jax torch; do KERAS_BACKEND=$b timeout 120 python3 benchmarks/oom_recovery.py --out "$OUT/oom_recovery_$b.json" 2>&1 | tail -8; done
  ;;
overhead)
  # Issue 12: all callbacks against a bare fit, with an A/A beside it (~1 ms JAX step, ~7 ms torch step);
  # then the per-step host cost on this machine's idle CPU cores (JAX and torch on CPU).
  KERAS_BACKEND=jax timeout 240 python3 benchmarks/gpu_overhead_aa.py --width 4096 --layers 3 --batch 1024 \
    --steps 200 --rounds 15 --out "$OUT/gpu_overhead_aa_jax.json" 2>&1 | tail -6
  KERAS_BACKEND=torch timeout 240 python3 benchmarks/gpu_overhead_aa.py --width 4096 --layers 3 --batch 2048 \
    --steps 100 --rounds 15 --out "$OUT/gpu_overhead_aa_torch.json" 2>&1 | tail -6
  # On/off blocks of one fit, timed on the device, A/A beside (float32 GEMMs: below the power limit, steadier)
  JAX_DEFAULT_MATMUL_PRECISION=highest KERAS_BACKEND=jax timeout 240 python3 benchmarks/gpu_overhead_blocks.py \
    --width 2048 --batch 1024 --rounds 6 --out "$OUT/gpu_overhead_blocks_jax_fp32.json" 2>&1 | tail -3
  JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES= timeout 200 python3 benchmarks/host_overhead.py --backends jax,torch \
    --rounds 15 --steps 1500 --out "$OUT/host_overhead_cpu.json" 2>&1 | tail -24
  ;;
distributed)
  # Issue 11, on a machine of 2 or 4 GPUs: MFU over 1/2/4 GPUs, a straggler job, the two-process example,
  # a real OOM under DataParallel; then the suite's multi-process jobs (tests/distributed) on GPUs, one GPU
  # per process (4 jobs at a time, so JAX must not preallocate).
  KERAS_BACKEND=jax timeout 320 python3 benchmarks/distributed_proof.py --out "$OUT/distributed.json" 2>&1 \
    | tee "$OUT/distributed.log" | grep -v -E "^(I0000|W0000|WARNING: All log)"
  # MFU again with work per GPU large enough that the gradient all-reduce is a small part of the step
  KERAS_BACKEND=jax timeout 200 python3 benchmarks/distributed_proof.py --parts mfu --per-device-batch 65536 \
    --steps 12 --out "$OUT/distributed_mfu64k.json" 2>&1 | grep -E "device\(s\)"
  KGT_JOB_GPUS=1 XLA_PYTHON_CLIENT_PREALLOCATE=false KERAS_BACKEND=jax timeout 220 python3 -m pytest -q -n 4 \
    -p no:cacheprovider tests/distributed 2>&1 | tee "$OUT/jobs_on_gpus.log" | tail -25
  ;;
esac
exit 0
