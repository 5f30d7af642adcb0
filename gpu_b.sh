#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export KGT_GPU_REPORT_DIR=$OUT PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
SECONDS=0
KERAS_BACKEND=torch timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -s tests/callbacks/test_gpu_utilization_logger_health_gpu.py tests/callbacks/test_oom_gpu.py tests/reporting/test_report_health_gpu.py > $OUT/gpu_tests_torch.log 2>&1
echo "torch rc=$? ${SECONDS}s"; grep -E "passed|failed|FAILED|^E " $OUT/gpu_tests_torch.log | tail -8
SECONDS=0
KERAS_BACKEND=jax timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -s tests/callbacks/test_profiler_window_gpu.py tests/layers/test_mixed_precision_gpu.py tests/reporting/test_report_health_gpu.py > $OUT/gpu_tests_jax.log 2>&1
echo "jax rc=$? ${SECONDS}s"; grep -E "passed|failed|FAILED|^E " $OUT/gpu_tests_jax.log | tail -8
SECONDS=0
timeout 60 python3 benchmarks/sampler_cost.py --backend jax --out $OUT/sampler_cost_h200.json > $OUT/sampler_cost.log 2>&1
echo "sampler rc=$? ${SECONDS}s"; tail -12 $OUT/sampler_cost.log
SECONDS=0
cd benchmarks && timeout 200 python3 planner_throughput.py --backend torch --model conv --max-seconds 110 --out $OUT/planner_throughput_h200_torch_conv.json > $OUT/planner_torch_conv.log 2>&1
echo "planner torch conv rc=$? ${SECONDS}s"; grep -v -E "^(W|I)[0-9]{4}" $OUT/planner_torch_conv.log | tail -25
