#!/usr/bin/env bash
# results/sweep_cpu/: default configuration vs random search vs PBT, 16 members each, TD3 on
# Pendulum-v1 (64-64 networks), the same 240 s of wall time each, one arm after the other.
#   bash results/sweep_cpu/run.sh                  # the three runs (~13 min), replay, figures
#   STAGE=analyse bash results/sweep_cpu/run.sh    # only the figures, tables and the replay
# Runs fastpop from a clean export of one commit (the working tree may hold other work in
# progress) with the members per chunk pinned (FASTPOP_MEMBERS_PER_CHUNK=16: one vmap over the
# population), so that no arm pays the chunk-size measurement and every arm runs the same code.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$REPO/results/sweep_cpu
SWEEP=$OUT/td3_pendulum_sweep_cpu.yaml
COMMIT=${COMMIT:-ddfb1cc}
SNAP=${SNAP:-/tmp/fastpop_$COMMIT}
STAGE=${STAGE:-all}
if [ ! -d "$SNAP" ]; then
  mkdir -p "$SNAP" && git -C "$REPO" archive "$COMMIT" | tar -x -C "$SNAP"
fi
cd "$SNAP"                      # python -m puts the cwd first on sys.path: the export's fastpop
export PYTHONPATH=$SNAP FASTPOP_MEMBERS_PER_CHUNK=16
fp() { python -m fastpop "$@"; }

# Load average every 10 s while an arm trains (the machine is shared): load_<arm>.txt
train_arm() {
  local arm=$1; shift
  (while true; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done) \
    > "$OUT/load_$arm.txt" &
  local sampler=$!
  fp train "$@" --out "$OUT/$arm" --overwrite > "$OUT/train_$arm.log" 2>&1
  kill "$sampler"
}

if [ "$STAGE" = all ]; then
  # default: the preset's configuration (actor/critic lr 1e-3, TD3 defaults otherwise) x 16 seeds
  train_arm default configs/td3_pendulum_cpu.yaml --set name=default \
    --set population.seeds=16 --set population.size=16 \
    --set train.max_wall_seconds=240 --set train.total_env_steps=1000000 \
    --set replay.capacity=100000 --set log.tensorboard=false
  # random search: 16 prior draws x 1 seed (members never interact)
  train_arm random_search "$SWEEP" --set name=random_search
  # PBT: the same 16 initial draws and member seeds; every 4k steps per member the bottom 4
  # copy one of the top 4 (whole state) and perturb or resample its hparams
  train_arm pbt "$SWEEP" --set name=pbt --set strategy=pbt
fi

mkdir -p "$OUT/aggregate_stock" "$OUT/aggregate" "$OUT/runs_plot"
# Stock aggregate over the three runs, one group per run (strata: configurations in a run)
fp plot --aggregate --by run "$OUT/default" "$OUT/random_search" "$OUT/pbt" \
  --out "$OUT/aggregate_stock" --table --minutes 1,2,3,4 > "$OUT/aggregate_stock/table.md"
# The same statistics with every arm's 16 members as one stratum (README: why)
python "$OUT/aggregate_arms.py" "$OUT/default" "$OUT/random_search" "$OUT/pbt" \
  --out "$OUT/aggregate" --minutes 1,2,3,4 > "$OUT/aggregate/table.md"
# Best member and median per evaluation round against wall time, and PBT's hparams / family tree
fp plot "$OUT/default" "$OUT/random_search" "$OUT/pbt" --out "$OUT/runs_plot" \
  --table --minutes 1,2,3,4 > "$OUT/runs_plot/table.md"
fp plot --hparams "$OUT/pbt"
# Replay the best PBT member's hparam schedule from scratch, 5 seeds of it. (The documented
# `--set population.size=5` alone is refused: the replay's config pins population.seeds=1.)
(while true; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done) \
  > "$OUT/load_pbt_replay.txt" &
sampler=$!
fp pbt-replay "$OUT/pbt" --member best --out "$OUT/pbt_replay" --overwrite \
  --set population.seeds=5 --set population.size=5 --set log.tensorboard=false \
  > "$OUT/train_pbt_replay.log" 2>&1
kill "$sampler"
# The replay's 5 seeds at its end (one group, one stratum: its members are seeds of one config)
mkdir -p "$OUT/pbt_replay/aggregate"
fp plot --aggregate "$OUT/pbt_replay" --out "$OUT/pbt_replay/aggregate" --table \
  --minutes 0.5,1,1.5,1.9 > "$OUT/pbt_replay/aggregate/table.md"
