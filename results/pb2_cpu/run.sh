#!/usr/bin/env bash
# The runs of results/pb2_cpu/, seed by seed so that drift of the machine touches every arm
# alike; then the figure and table of the arms run.
#   bash results/pb2_cpu/run.sh [--rev REV] [--arms "ARM ..."] [--name NAME] OUT_DIR
# Arms (default: the first four, 20 runs x 120 s, ~45 min with start-up):
#   independent pbt pb2 halving   td3_gymnax_pendulum_sweep.yaml, device mode, 120 s each
#   pbt_lagging pb2_lagging       td3_pendulum_lagging_sweep.yaml: process mode, the evaluator
#                                 lagging behind the learner, 120 s each
# fastpop runs from a `git archive` export of REV (default HEAD; edits to the tree cannot
# change a run); compare.py writes NAME.json and NAME.png (default comparison, walltime_vs_iqm)
# into results/pb2_cpu.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=HEAD arms="independent pbt pb2 halving" name=""
while [[ $# -gt 1 ]]; do
  case "$1" in
    --rev) rev=$2; shift 2 ;;
    --arms) arms=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "${1:?usage: run.sh [--rev REV] [--arms \"ARM ...\"] [--name NAME] OUT_DIR}")
mkdir -p "$out"
export_dir="$out/fastpop-$(git rev-parse --short "$rev")"
mkdir -p "$export_dir" && git archive "$rev" | tar -x -C "$export_dir"
configs=results/pb2_cpu
for seed in 0 1 2 3 4; do
  for arm in $arms; do
    case "$arm" in
      independent|pbt|pb2|halving) config=$configs/td3_gymnax_pendulum_sweep.yaml strategy=$arm ;;
      pbt_lagging|pb2_lagging) config=$configs/td3_pendulum_lagging_sweep.yaml strategy=${arm%_lagging} ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    # the config from this tree: an older REV reads it too (no field it lacks)
    (cd "$export_dir" && PYTHONPATH="$export_dir" python -m fastpop train "$OLDPWD/$config" \
      --set strategy="$strategy" --set seed=$seed --out "$out/${arm}_seed$seed" \
      > "$out/${arm}_seed$seed.log" 2>&1)
  done
done
python results/pb2_cpu/compare.py "$out" --out results/pb2_cpu ${name:+--name "$name"}
