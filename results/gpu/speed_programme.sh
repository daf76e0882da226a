#!/usr/bin/env bash
# The GPU speed programme (`fastpop bench gpu --short`), in two remote commands of at most
# 600 s each (README.md beside this file says how to carry the wheels):
#   GPU_COMMIT=<short sha> bash results/gpu/speed_programme.sh update    # <= 420 s
#   GPU_COMMIT=<short sha> bash results/gpu/speed_programme.sh learner   # pipeline + pbt, <= 325 s
# Each writes a fresh directory, results/gpu/<gpu model>-<commit>[-runN] (never one that holds
# the phases it is about to run), packs it into $OUT/gpu.tgz after every phase (no run
# checkpoints) and logs the console to $OUT/log_<part>.txt. The time each may take is
# gpu_plans.call_seconds' (tests/test_bench_gpu.py holds it 30 s inside the remote limit); the
# outer timeout's SIGKILL follows its SIGTERM by KILL_MARGIN_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/../.."
part="${1:-update}"
case "$part" in
  update) phases=update ;;
  learner) phases=pipeline,pbt ;;
  *) echo "speed_programme.sh: unknown part '$part'; choose update or learner" >&2; exit 2 ;;
esac
# shellcheck source=results/gpu/device_env.sh
source results/gpu/device_env.sh
commit="${GPU_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown-commit)}"
base="results/gpu/${model:-unknown-gpu}-${commit}"
out="$base"
run=1
while [ -e "$out/phase_${phases%%,*}.json" ]; do  # a fresh directory for these phases
  run=$((run + 1))
  out="${base}-run${run}"
done
seconds=$(python3 -c "from fastpop.bench import gpu_plans as g
phases = '$phases'.split(',')
print(int(g.call_seconds(phases, g.SHORT_CAPS) - g.INSTALL_SECONDS - g.KILL_MARGIN_SECONDS))")
margin=$(python3 -c "from fastpop.bench import gpu_plans as g; print(int(g.KILL_MARGIN_SECONDS))")
log="${OUT:-/tmp}/log_${part}.txt"
echo "== speed_programme.sh $part: phases $phases into $out, at most $seconds s" | tee "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1 | tee -a "$log"
timeout -k "$margin" "$seconds" python3 -m fastpop bench gpu --short --phases "$phases" \
  --out "$out" --pack "${OUT:-/tmp}/gpu.tgz" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
ls -la "${OUT:-/tmp}"
exit "$status"
