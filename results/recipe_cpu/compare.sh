#!/usr/bin/env bash
# Plain TD3 against TD3 with the recipe (C51 critic + LayerNorm, 3-step returns, observation
# normalization, many envs per member), 5 seeds per arm trained side by side in one population
# (population.seeds=5), each arm given the same wall time on this machine; then the IQM of the
# 5 seeds with 95% stratified-bootstrap intervals at equal wall time (fastpop plot --aggregate).
#   bash results/recipe_cpu/compare.sh pendulum   # gymnax Pendulum-v1, device mode, 90 s per arm
#   bash results/recipe_cpu/compare.sh hopper     # gymnasium Hopper-v5, process mode, 300 s per arm
#   bash results/recipe_cpu/compare.sh pendulum-pbt   # the recipe's defaults (8 seeds) against
#                                                     # PBT over its knobs (8 members), 120 s each
# Runs go to results/recipe_cpu/runs/<task>/<arm> (not committed); the tables to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
task=${1:?pendulum, hopper or pendulum-pbt}
arms=(plain recipe)
out=results/recipe_cpu/runs/$task
mkdir -p "$out"
seeds=(--set population.size=5 --set population.seeds=5 --set log.tensorboard=false)
case $task in
  pendulum)
    seconds=90
    plain=(configs/td3_gymnax_pendulum_cpu.yaml)
    recipe=(configs/td3_recipe_gymnax_pendulum_cpu.yaml)
    common=(--set train.total_env_steps=1_000_000 --set replay.capacity=160_000
            --set eval.interval=2_048 --set "train.max_wall_seconds=$seconds")
    minutes=0.25,0.5,0.75,1,1.5
    ;;
  hopper)
    seconds=300
    plain=(configs/td3_hopper.yaml --set replay.min_size=5_000 --set collect.warmup_steps=5_000
           --set collect.num_collectors=1)
    recipe=(configs/td3_hopper.yaml --set replay.min_size=5_000 --set collect.warmup_steps=5_000
            --set collect.num_collectors=1 --set collect.envs_per_member=4
            --set agent.critic=distributional --set agent.v_min=-100.0 --set agent.v_max=400.0
            --set agent.layer_norm=true --set agent.n_step=3 --set agent.observation_norm=true
            --set replay.samples_per_insert=64.0)
    common=(--set train.total_env_steps=1_000_000 --set replay.capacity=200_000
            --set eval.interval=5_000 --set eval.episodes=5 --set "train.max_wall_seconds=$seconds")
    minutes=1,2,3,4,5
    ;;
  pendulum-pbt)
    seconds=120
    arms=(recipe pbt)
    seeds=(--set log.tensorboard=false)
    recipe=(configs/td3_recipe_gymnax_pendulum_cpu.yaml --set population.size=8
            --set population.seeds=8)
    pbt=(configs/td3_recipe_pbt_gymnax_pendulum_cpu.yaml)
    common=(--set train.total_env_steps=1_000_000 --set replay.capacity=160_000
            --set eval.interval=2_048 --set "train.max_wall_seconds=$seconds")
    minutes=0.5,1,1.5,2
    ;;
  *) echo "unknown task $task: pendulum, hopper or pendulum-pbt" >&2; exit 2 ;;
esac
for arm in "${arms[@]}"; do
  [ -e "$out/$arm" ] && { echo "$out/$arm exists: remove it to run again" >&2; exit 2; }
done
for arm in "${arms[@]}"; do
  declare -n preset="$arm"
  python -m fastpop train "${preset[@]}" "${seeds[@]}" "${common[@]}" --out "$out/$arm" \
    > "$out/$arm.log" 2>&1
done
python -m fastpop plot --aggregate --by run "${arms[@]/#/$out/}" --out "$out/plots" \
  --table --minutes "$minutes"
