#!/usr/bin/env bash
# Issue 47's GPU programme, each part one remote command of at most 600 s (README.md beside
# this file says how to carry the wheels):
#   bash results/gpu/issue47.sh [programme [ARGS]]  # `fastpop bench gpu --short ARGS`: the update
#       against its floor, the best sequential JAX and PyTorch rows and each lever; brax/ant
#       at 16 envs per member; the learner with 14 collectors; the 256-member SAC PBT
#   bash results/gpu/issue47.sh command-buffers  # TD3's vectorized update under XLA's GPU
#       command-buffer settings (the lever that is flags, not code), one process per setting
# Into results/gpu/<gpu model>-issue47 (BENCH_OUT replaces it), packed into $OUT/gpu.tgz
# without run checkpoints, the console log beside it.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=results/gpu/device_env.sh
source results/gpu/device_env.sh
out="${BENCH_OUT:-results/gpu/${model:-unknown-gpu}-issue47}"
log="${OUT:-/tmp}/log.txt"
status=0
if [ "${1:-programme}" = command-buffers ]; then
  # off; XLA's default; loops and conditionals inside the graphs too
  for flags in "off:--xla_gpu_enable_command_buffer=" "default:" \
    "loops:--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"; do
    name=${flags%%:*}
    echo "== command buffers: $name (XLA_FLAGS=${flags#*:})" | tee -a "$log"
    XLA_FLAGS="${flags#*:}" timeout "${ROW_SECONDS:-60}" python3 -m fastpop bench update \
      --algo td3 --pop 80,256 --impl vectorized --min-seconds 0.5 \
      --out "$out/command_buffers_$name" 2>&1 | tee -a "$log" || status=1
  done
else
  shift || true
  timeout "${BENCH_SECONDS:-560}" python3 -m fastpop bench gpu --short --out "$out" "$@" 2>&1 \
    | tee "$log"
  status=${PIPESTATUS[0]}
fi
tar czf "${OUT:-/tmp}/gpu.tgz" --exclude=checkpoints "$out"
ls -la "${OUT:-/tmp}"
exit "$status"
