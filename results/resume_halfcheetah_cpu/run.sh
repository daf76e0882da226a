#!/usr/bin/env bash
# Does a resumed run carry on where it stopped? One TD3 agent on HalfCheetah-v5, 10 minutes of
# wall time: uninterrupted; stopped by Ctrl-C (SIGINT) after 5 minutes and resumed; the same
# with checkpoint.replay=false (the resumed learner refills its replay). One after the other
# on an otherwise idle machine, then the plots and the table. About 32 minutes.
#   bash results/resume_halfcheetah_cpu/run.sh
set -euo pipefail
out=results/resume_halfcheetah_cpu
preset=configs/td3_halfcheetah_cpu.yaml
common=(--set log.tensorboard=false --set train.max_wall_seconds=600 --overwrite)
fastpop train "$preset" "${common[@]}" --out "$out/uninterrupted"
timeout -s INT 300 fastpop train "$preset" "${common[@]}" --out "$out/resumed" || true
fastpop resume "$out/resumed"
timeout -s INT 300 fastpop train "$preset" "${common[@]}" --out "$out/resumed_without_replay" \
  --set checkpoint.replay=false || true
fastpop resume "$out/resumed_without_replay"
fastpop plot "$out/uninterrupted" "$out/resumed" "$out/resumed_without_replay" --out "$out" \
  --table --minutes 4,5,6,7,10 | grep '^|' > "$out/table.md"
