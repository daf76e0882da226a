#!/usr/bin/env bash
# DQN on CartPole three ways, walltime vs return: fastpop with the envs on
# the device (gymnax/CartPole-v1, the preset configs/dqn_gymnax_cartpole_cpu.yaml as it is),
# fastpop with gymnasium's CartPole-v1 in 2 collector processes (only the env and collection
# changed), and rejax's DQN (a pure-JAX peer, its own venv) with the same values. Each is a
# population of 4 seeds of one configuration (population.seeds=4; rejax: 4 vmapped seeds), one
# after the other on an otherwise idle machine. About a minute in all, plus rejax's install.
#   bash results/device_envs_cpu/run.sh
set -euo pipefail
out=results/device_envs_cpu
preset=configs/dqn_gymnax_cartpole_cpu.yaml
common=(--set population.seeds=4 --set log.tensorboard=false --overwrite)
venv=${REJAX_VENV:-/tmp/rejax-venv}
if [ ! -x "$venv/bin/python" ]; then
  python -m venv "$venv"
  "$venv/bin/pip" install -q rejax==0.1.3 jax==0.10.2 gymnax==0.0.9
fi
uptime > "$out/load.txt"
/usr/bin/time -f "%e s" -o "$out/wall_device.txt" \
  fastpop train "$preset" "${common[@]}" --out "$out/device" > "$out/train_device.log" 2>&1
uptime >> "$out/load.txt"
/usr/bin/time -f "%e s" -o "$out/wall_process.txt" \
  fastpop train "$preset" "${common[@]}" --out "$out/process" --set env.id=CartPole-v1 \
  --set collect.mode=processes --set collect.num_collectors=2 > "$out/train_process.log" 2>&1
uptime >> "$out/load.txt"
/usr/bin/time -f "%e s" -o "$out/wall_rejax.txt" \
  "$venv/bin/python" "$out/rejax_dqn.py" --seeds 4 --out "$out/rejax.json" > "$out/rejax.log" 2>&1
uptime >> "$out/load.txt"
fastpop plot "$out/device" "$out/process" --out "$out" --table --minutes 0.05,0.1,0.15,0.2,0.3 \
  | grep '^|' > "$out/table.md"
