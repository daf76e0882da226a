#!/usr/bin/env bash
# The 20 runs of results/pb2_cpu/ (4 strategies x 5 seeds, 120 s each, ~45 min with start-up),
# seed by seed so that drift of the machine touches every arm alike; then the figure and table.
#   bash results/pb2_cpu/run.sh OUT_DIR
# fastpop runs from a `git archive` export of HEAD (edits to the tree cannot change a run).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: run.sh OUT_DIR}")
mkdir -p "$out"
export_dir="$out/fastpop-$(git rev-parse --short HEAD)"
mkdir -p "$export_dir" && git archive HEAD | tar -x -C "$export_dir"
config=results/pb2_cpu/td3_gymnax_pendulum_sweep.yaml
for seed in 0 1 2 3 4; do
  for strategy in independent pbt pb2 halving; do
    (cd "$export_dir" && PYTHONPATH="$export_dir" python -m fastpop train "$config" \
      --set strategy=$strategy --set seed=$seed --out "$out/${strategy}_seed$seed" \
      > "$out/${strategy}_seed$seed.log" 2>&1)
  done
done
python results/pb2_cpu/compare.py "$out" --out results/pb2_cpu
