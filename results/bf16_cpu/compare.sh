#!/usr/bin/env bash
# float32 against bfloat16 matmuls (agent.compute_dtype; parameters and optimizer state stay
# float32), the lever kept off a preset's default until learning is measured equal.
# 8 seeds per arm trained side by side in one population (population.seeds=8), the same env
# steps per member for both arms; then the IQM of the 8 seeds' latest evaluation with 95%
# stratified-bootstrap intervals (fastpop plot --aggregate --table: a column past both runs'
# end holds their final evaluation, after the same env steps).
#   bash results/bf16_cpu/compare.sh td3   # gymnax Pendulum-v1, device mode, 20k steps each
#   bash results/bf16_cpu/compare.sh sac   # the same with SAC
#   HIDDEN=256 bash results/bf16_cpu/compare.sh td3   # 256-256 networks (the GPU presets')
# Runs go to results/bf16_cpu/runs/<algo>-<hidden>/<arm> (not committed); tables to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
algo=${1:?td3 or sac}
case $algo in td3 | sac) ;; *) echo "unknown algo $algo: td3 or sac" >&2; exit 2 ;; esac
hidden=${HIDDEN:-64}  # the preset's 64-64
out=results/bf16_cpu/runs/$algo-$hidden
arms=(float32 bfloat16)
for arm in "${arms[@]}"; do
  [ -e "$out/$arm" ] && { echo "$out/$arm exists: remove it to run again" >&2; exit 2; }
done
mkdir -p "$out"
for arm in "${arms[@]}"; do
  python -m fastpop train configs/td3_gymnax_pendulum_cpu.yaml --set "algo=$algo" \
    --set "agent.compute_dtype=$arm" --set "agent.hidden_sizes=[$hidden,$hidden]" \
    --set population.size=8 --set population.seeds=8 \
    --set train.total_env_steps=20_000 --set replay.capacity=20_000 \
    --set log.tensorboard=false --out "$out/$arm" > "$out/$arm.log" 2>&1
done
python -m fastpop plot --aggregate --by run "${arms[@]/#/$out/}" --out "$out/plots" \
  --table --minutes 0.5,1,10
python results/bf16_cpu/paired.py "$out"
