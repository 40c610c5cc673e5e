#!/bin/bash
# The GPU checks of docs/BENCHMARKS.md in one short run, on one NVIDIA GPU with agentjax's
# dependencies installed (pip install -e '.[cuda]'); run from the repository root:
#
#   bash launch/gpu_checks.sh [fit specs...]
#     1. python launch/bench.py gpu: the qwen2.5-1.5b shape run for real in bfloat16: decode
#        tokens/s against the HBM roofline, train-step MFU, attention cudnn vs blockwise vs xla.
#     2. launch/fit.py --backend=gpu --extrapolate=2,4: the paper presets' programs compiled
#        (never run) by the GPU compiler on mock GPUs (jax_mock_gpu_topology), at 2 and 4 layers,
#        extrapolated to the model's depth, beside the CPU compiler's figures (docs/BENCHMARKS.md,
#        fit). CPU-bound (seconds a program); it runs beside 1. A spec is
#        method:preset:devices:programs, e.g. dac:qwen3-8b:8:rollout,generator_rollout,update
#        (default: one per paper preset, below).
#   bash launch/gpu_checks.sh async
#     launch/bench.py async at qwen2.5-1.5b's shape in bfloat16 instead (the scripted mix policy;
#     async_steps 0, 1, 2; the sampler/trainer mismatch metrics), every step's compiles printed.
#
# Results and logs go to $OUT (default /tmp/gpu_checks): env.txt (GPU, driver, package versions),
# bench_gpu.log, fit_gpu.log or bench_async.log. Time limits: BENCH_TIMEOUT (seconds for the
# benchmark), FIT_SECONDS (no new fit spec starts after it); async: ASYNC_STEPS, ASYNC_ARGS.
# A machine without network access: put the wheels of the packages it lacks in .whl/ (e.g.
# `pip download -d .whl <package>` elsewhere); they are installed into /tmp/site first.
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import jax, flax, optax, orbax.checkpoint, chex, transformers; \
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, \
'transformers', transformers.__version__, jax.devices())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "${1:-}" = async ]; then
  # XLA's GEMM autotuner off: a fresh machine compiles ~30 programs (decode per live-slot count
  # and key window, prefill per length, the update per packed shape) and a short GPU run's
  # time is minutes; cuBLAS's heuristics pick the kernels instead.
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" timeout ${BENCH_TIMEOUT:-480} \
    python3 launch/bench.py async --mix_model=qwen2.5-1.5b --dtype=bfloat16 \
    --steps=${ASYNC_STEPS:-4} ${ASYNC_ARGS:-} 2>&1 | grep -v "^[IW][0-9]" | tee "$OUT/bench_async.log"
  exit 0
fi

specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  specs=(cw_grpo:qwen3-8b:4:rollout,update coreact:qwen3-14b:8:rollout,update
         igpo:qwen2.5-7b:8:rollout,update dac:qwen3-8b:8:generator_rollout,update)
fi
(
  for spec in "${specs[@]}"; do
    IFS=: read -r method preset devices programs <<< "$spec"
    if [ $SECONDS -gt ${FIT_SECONDS:-330} ]; then echo "# skipped: $spec (time)"; continue; fi
    echo "# $method $preset devices=$devices programs=$programs"
    timeout 300 python3 launch/fit.py --config=configs/$method.py:$preset --backend=gpu \
      --devices=$devices --device_memory_gb=80 --extrapolate=2,4 --programs=$programs 2>&1 \
      | grep -v "^[IW][0-9]"
  done
) > "$OUT/fit_gpu.log" 2>&1 &
fit_pid=$!

timeout ${BENCH_TIMEOUT:-330} python3 launch/bench.py gpu 2>&1 | grep -v "^[IW][0-9]" \
  | tee "$OUT/bench_gpu.log"
wait $fit_pid
cat "$OUT/fit_gpu.log"
