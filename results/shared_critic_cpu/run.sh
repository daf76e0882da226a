#!/usr/bin/env bash
# CEM-RL and DvD on a 2-core CPU, each next to an independent TD3 population of the
# same size on the same task and the same 15-minute wall budget, one run after the other on an
# otherwise idle machine, then the plots. About 62 minutes.
#   bash results/shared_critic_cpu/run.sh
set -euo pipefail
out=results/shared_critic_cpu
common=(--set log.tensorboard=false --overwrite)
independent=(--set strategy=independent --set replay.shared=false)
fastpop train configs/td3_cemrl_hopper_cpu.yaml "${common[@]}" --out "$out/cemrl_hopper"
fastpop train configs/td3_cemrl_hopper_cpu.yaml "${common[@]}" "${independent[@]}" \
  --out "$out/independent_hopper"
fastpop train configs/td3_dvd_humanoid_cpu.yaml "${common[@]}" --out "$out/dvd_humanoid"
fastpop train configs/td3_dvd_humanoid_cpu.yaml "${common[@]}" "${independent[@]}" \
  --out "$out/independent_humanoid"
fastpop plot "$out/cemrl_hopper" "$out/independent_hopper" --out "$out/hopper" --table --minutes 5,10,15 \
  | grep '^|' > "$out/hopper/table.md"
fastpop plot "$out/dvd_humanoid" "$out/independent_humanoid" --out "$out/humanoid" --table --minutes 5,10,15 \
  | grep '^|' > "$out/humanoid/table.md"
