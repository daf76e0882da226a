#!/usr/bin/env bash
# The GPU learning programme (`fastpop bench gpu --learning`) in one remote command of at
# most 540 s (README.md beside this file says how to carry the wheels; the device tool's
# timeout_s 600):
#   GPU_COMMIT=<short sha> bash results/gpu/learning_programme.sh
# In order, each run packed into $OUT/gpu.tgz as soon as it is written (no run checkpoints):
# the TD3 recipe on the G1 humanoid (configs/td3_recipe_playground_g1_joystick.yaml: FastTD3's
# published Playground task; its robot's models are carried in .whl/menagerie/, made as
# menagerie_models.py beside this file says, and installed first) from fresh for 300 s,
# 256-member SAC PBT on brax/ant (configs/sac_pbt_brax_ant.yaml at EvoRL's update ratio, a PBT
# round every 6,144 env steps per member) for 90 s, and, where the cap leaves time, the same
# population with PBT off. It writes a fresh directory, results/gpu/<gpu model>-learning-<commit>
# [-runN], and logs the console to $OUT/log_learning.txt. The time it may take is
# gpu_plans.call_seconds' (tests/test_bench_gpu_learning.py holds it within 540 s); the outer
# timeout's SIGKILL follows its SIGTERM by KILL_MARGIN_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=results/gpu/device_env.sh
source results/gpu/device_env.sh
models=.whl/menagerie/unitree_g1.tar.gz
if ! python3 results/gpu/menagerie_models.py install "$models"; then
  echo "== learning_programme.sh: the G1's models ($models) could not be installed:" \
    "make them with results/gpu/menagerie_models.py pack before the lease" >&2
  exit 2
fi
commit="${GPU_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown-commit)}"
base="results/gpu/${model:-unknown-gpu}-learning-${commit}"
out="$base"
run=1
while [ -e "$out/phase_learning.json" ]; do  # a fresh directory
  run=$((run + 1))
  out="${base}-run${run}"
done
seconds=$(python3 -c "from fastpop.bench import gpu_plans as g
print(int(g.call_seconds(['learning'], g.LEARNING_CAPS) - g.INSTALL_SECONDS - g.KILL_MARGIN_SECONDS))")
margin=$(python3 -c "from fastpop.bench import gpu_plans as g; print(int(g.KILL_MARGIN_SECONDS))")
log="${OUT:-/tmp}/log_learning.txt"
echo "== learning_programme.sh: the learning programme into $out, at most $seconds s" | tee "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
timeout -k "$margin" "$seconds" python3 -m fastpop bench gpu --learning \
  --out "$out" --pack "${OUT:-/tmp}/gpu.tgz" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
ls -la "${OUT:-/tmp}"
exit "$status"
