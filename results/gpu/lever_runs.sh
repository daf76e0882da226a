#!/usr/bin/env bash
# The GPU lever runs, each part one remote command of at most 600 s (README.md beside
# this file says how to carry the wheels):
#   bash results/gpu/lever_runs.sh [programme [ARGS]]  # `fastpop bench gpu --short ARGS`: the update
#       against its floor, the best sequential JAX and PyTorch rows and each lever; brax/ant
#       at 16 envs per member; the learner with 14 collectors; the 256-member SAC PBT
#   bash results/gpu/lever_runs.sh command-buffers  # TD3's vectorized update under XLA's GPU
#       command-buffer settings (the lever that is flags, not code), one process per setting
#   bash results/gpu/lever_runs.sh remaining  # what the first H100 run left out: TD3 at P = 256
#       against its floor and baselines, the unroll levers, command buffers off / with loops
#       at P = 80, and brax/ant in device mode at 16 envs per member (~7 minutes)
#   bash results/gpu/lever_runs.sh kernels  # where the vectorized step's time goes: TD3 and SAC
#       at P = 80 and 256 (TD3 also with bf16) traced by `bench update --kernel-times` (~3 min)
#   bash results/gpu/lever_runs.sh pbt-bf16  # the 256-member SAC PBT on brax/ant with bfloat16
#       matmuls (`--short`'s pbt phase with --set agent.compute_dtype=bfloat16, ~2.5 min): the
#       lever for the 5 s target with the evaluation pauses in (device mode is update-bound)
# Into results/gpu/<gpu model>-levers (BENCH_OUT replaces it), packed into $OUT/gpu.tgz
# without run checkpoints, the console log beside it.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=results/gpu/device_env.sh
source results/gpu/device_env.sh
out="${BENCH_OUT:-results/gpu/${model:-unknown-gpu}-levers}"
log="${OUT:-/tmp}/log.txt"
status=0
part() {  # part NAME SECONDS COMMAND...: one measurement under a time cap, its console logged
  local name=$1 seconds=$2
  shift 2
  echo "== $name: $*" | tee -a "$log"
  timeout "$seconds" "$@" 2>&1 | tee -a "$log" || status=1
}
# XLA's GPU command buffers: off, and with loops and conditionals inside the graphs too
buffers_off="--xla_gpu_enable_command_buffer="
buffers_loops="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
if [ "${1:-programme}" = command-buffers ]; then
  for flags in "off:$buffers_off" "default:" "loops:$buffers_loops"; do
    name=${flags%%:*}
    XLA_FLAGS="${flags#*:}" part "command buffers: $name (XLA_FLAGS=${flags#*:})" \
      "${ROW_SECONDS:-60}" python3 -m fastpop bench update --algo td3 --pop 80,256 \
      --impl vectorized --min-seconds 0.5 --out "$out/command_buffers_$name"
  done
elif [ "${1:-programme}" = kernels ]; then
  for algo in td3 sac; do
    impls=vectorized
    [ "$algo" = td3 ] && impls=vectorized,vectorized+bf16
    part "kernel times: $algo" "${ROW_SECONDS:-150}" python3 -m fastpop bench update \
      --algo "$algo" --pop 80,256 --impl "$impls" --min-seconds 0.5 --anatomy-from 80 \
      --kernel-times --out "$out/kernel_times_$algo"
  done
elif [ "${1:-programme}" = remaining ]; then
  part td3-256 150 python3 -m fastpop bench update --algo td3 --pop 256 --min-seconds 0.5 \
    --impl vectorized,sequential-in-one-program,torch-func,vectorized+bf16 --anatomy-from 80 \
    --out "$out/update_td3_256"
  part unroll 90 python3 -m fastpop bench update --algo td3 --pop 80 --min-seconds 0.5 \
    --impl vectorized,vectorized+unroll-2,vectorized+unroll-5 --anatomy-from 1000 \
    --out "$out/update_td3_unroll"
  for flags in "off:$buffers_off" "loops:$buffers_loops"; do
    XLA_FLAGS="${flags#*:}" part "command-buffers-${flags%%:*}" 50 python3 -m fastpop bench \
      update --algo td3 --pop 80 --impl vectorized --min-seconds 0.5 --anatomy-from 1000 \
      --out "$out/command_buffers_${flags%%:*}"
  done
  part ant-e16 140 python3 -m fastpop bench device --env brax/ant --pop 256 \
    --envs-per-member 16 --process-env none --seconds 10 --out "$out/device_ant_e16"
elif [ "${1:-programme}" = pbt-bf16 ]; then
  part "sac pbt, bf16" "${ROW_SECONDS:-170}" python3 -m fastpop bench gpu --short --phases pbt \
    --set agent.compute_dtype=bfloat16 --out "$out/pbt_bf16"
else
  shift || true
  timeout "${BENCH_SECONDS:-560}" python3 -m fastpop bench gpu --short --out "$out" "$@" 2>&1 \
    | tee "$log"
  status=${PIPESTATUS[0]}
fi
tar czf "${OUT:-/tmp}/gpu.tgz" --exclude=checkpoints "$out"
ls -la "${OUT:-/tmp}"
exit "$status"
