#!/usr/bin/env bash
# The walltime comparison on HalfCheetah-v5: one TD3 agent, an independent TD3
# population of 4 and a PBT TD3 population of 4, 20 minutes of wall time each, one after the
# other on an otherwise idle machine, then the plots. About 62 minutes.
#   bash results/walltime_halfcheetah_cpu/run.sh
set -euo pipefail
out=results/walltime_halfcheetah_cpu
common=(--set log.tensorboard=false --overwrite)
fastpop train configs/td3_halfcheetah_cpu.yaml "${common[@]}" --out "$out/td3_single"
fastpop train configs/td3_pbt_halfcheetah_cpu.yaml "${common[@]}" --out "$out/td3_independent" \
  --set strategy=independent
fastpop train configs/td3_pbt_halfcheetah_cpu.yaml "${common[@]}" --out "$out/td3_pbt"
fastpop plot "$out/td3_single" "$out/td3_independent" "$out/td3_pbt" --out "$out" --table \
  | grep '^|' > "$out/table.md"
fastpop plot --hparams "$out/td3_pbt"
