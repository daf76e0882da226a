#!/usr/bin/env bash
# Device mode against process mode on one task, walltime vs return:
# TD3 populations of 4 on the inverted pendulum, the preset configs/td3_brax_inverted_pendulum_cpu.yaml
# as it is (brax/inverted_pendulum, generalized backend, envs stepped on the device) and with only
# the environment and collection changed (gymnasium's InvertedPendulum-v5 in 2 collector
# processes; MuJoCo, the same dt 0.04 s and the same 1-per-step reward up to 1000 steps).
# population.seeds=4: the 4 members of each run are 4 seeds of one configuration. The two runs
# run one after the other on an otherwise idle machine. A few minutes in all.
#   bash results/device_vs_process_cpu/run.sh
set -euo pipefail
out=results/device_vs_process_cpu
preset=configs/td3_brax_inverted_pendulum_cpu.yaml
common=(--set population.seeds=4 --set log.tensorboard=false --overwrite)
uptime > "$out/load.txt"
fastpop train "$preset" "${common[@]}" --out "$out/device" > "$out/train_device.log" 2>&1
uptime >> "$out/load.txt"
fastpop train "$preset" "${common[@]}" --out "$out/process" --set env.id=InvertedPendulum-v5 \
  --set env.backend=null --set collect.mode=processes --set collect.num_collectors=2 \
  > "$out/train_process.log" 2>&1
uptime >> "$out/load.txt"
fastpop plot "$out/device" "$out/process" --out "$out" --table --minutes 0.1,0.2,0.3,0.4,0.5 \
  | grep '^|' > "$out/table.md"
fastpop plot --aggregate --by run "$out/device" "$out/process" --out "$out/aggregate" --table \
  --minutes 0.1,0.2,0.3,0.4,0.5 \
  | grep '^|' > "$out/aggregate.md"
