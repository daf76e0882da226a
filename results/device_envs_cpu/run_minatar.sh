#!/usr/bin/env bash
# DQN on Breakout-MinAtar for as long as the CPU allows in a few minutes: fastpop with the envs on
# the device and rejax, the CartPole comparison's values (run.sh) with the MLP torso both use
# (a 64-64 MLP on the flattened 10x10x4 grid), 40k env steps per member, epsilon decayed over
# 24k (60%), 2 seeds each. gymnasium has no MinAtar, so there is no process-mode arm.
#   bash results/device_envs_cpu/run_minatar.sh     (after run.sh has made rejax's venv)
set -euo pipefail
out=results/device_envs_cpu
venv=${REJAX_VENV:-/tmp/rejax-venv}
/usr/bin/time -f "%e s" -o "$out/wall_minatar_device.txt" \
  fastpop train configs/dqn_gymnax_cartpole_cpu.yaml --out "$out/minatar_device" --overwrite \
  --set env.id=gymnax/Breakout-MinAtar --set agent.torso=mlp --set population.size=2 \
  --set population.seeds=2 --set train.total_env_steps=40000 --set replay.capacity=20000 \
  --set hparams.epsilon_decay_steps=24000 --set eval.interval=8000 --set log.tensorboard=false \
  > "$out/train_minatar_device.log" 2>&1
/usr/bin/time -f "%e s" -o "$out/wall_minatar_rejax.txt" \
  "$venv/bin/python" "$out/rejax_dqn.py" --seeds 2 --env Breakout-MinAtar --steps 40000 \
  --eval-every 8000 --out "$out/rejax_minatar.json" > "$out/rejax_minatar.log" 2>&1
