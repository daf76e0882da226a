#!/usr/bin/env bash
# The runs of results/sweeps_long_cpu/, seed by seed with the arms interleaved so that drift of
# the machine touches every arm alike; then Ray Tune's PB2 on the same task; then the table and
# figure.
#   bash results/sweeps_long_cpu/run.sh [--arms "ARM ..."] [--seeds "K ..."] OUT_DIR
# Arms (default: all five; 5 seeds x 4 fastpop arms x 240 s + Ray, ~100 min):
#   independent pbt pb2 mfpbt   td3_gymnax_pendulum_long.yaml, device mode, 240 s each
#   ray_pb2                     ray_sweep.py --scheduler pb2 on gymnasium Pendulum-v1 with the
#                               same priors, 240 s each, in its own venv (RAY_PYTHON, default
#                               .venv-raytune/bin/python; install: results/vs_ray_tune/README.md)
# fastpop runs from a `git archive` export of HEAD (edits to the tree cannot change a run).
set -euo pipefail
cd "$(dirname "$0")/../.."
arms="independent pbt pb2 mfpbt ray_pb2" seeds="0 1 2 3 4"
while [[ $# -gt 1 ]]; do
  case "$1" in
    --arms) arms=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "${1:?usage: run.sh [--arms \"ARM ...\"] [--seeds \"K ...\"] OUT_DIR}")
ray_python=${RAY_PYTHON:-.venv-raytune/bin/python}
here=results/sweeps_long_cpu
mkdir -p "$out"
export_dir="$out/fastpop-$(git rev-parse --short HEAD)"
[[ -d "$export_dir" ]] || { mkdir -p "$export_dir" && git archive HEAD | tar -x -C "$export_dir"; }
for seed in $seeds; do
  for arm in $arms; do
    [[ -e "$out/${arm}_seed$seed" ]] && continue  # done by an earlier call: resumable
    case "$arm" in
      independent|pbt|pb2|mfpbt)
        (cd "$export_dir" && PYTHONPATH="$export_dir" python -m fastpop train \
          "$OLDPWD/$here/td3_gymnax_pendulum_long.yaml" --set strategy="$arm" --set seed="$seed" \
          --out "$out/${arm}_seed$seed" > "$out/${arm}_seed$seed.log" 2>&1) ;;
      ray_pb2)
        "$ray_python" results/vs_ray_tune/ray_sweep.py --scheduler pb2 --synch --task pendulum \
          --population 16 --budget-seconds 240 --seed "$seed" \
          --out "$out/${arm}_seed$seed" > "$out/${arm}_seed$seed.log" 2>&1 ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
  done
done
python $here/compare.py "$out" --out $here
