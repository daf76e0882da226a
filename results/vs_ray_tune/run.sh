#!/usr/bin/env bash
# The four arms of results/vs_ray_tune/, one after another on an otherwise idle machine
# (~42 min): fastpop PBT and PB2, Ray Tune PBT and PB2, 600 s each; then the table and figure.
#   bash results/vs_ray_tune/run.sh OUT_DIR [RAY_PYTHON]
# RAY_PYTHON: the Python of a venv with requirements.txt installed (default .venv-raytune).
# fastpop runs from a `git archive` export of HEAD, so edits to the working tree during the
# ~40 minutes cannot change an arm half way.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:?usage: run.sh OUT_DIR [RAY_PYTHON]}")
ray_python=${2:-.venv-raytune/bin/python}
mkdir -p "$out"
export_dir="$out/fastpop-$(git rev-parse --short HEAD)"
mkdir -p "$export_dir" && git archive HEAD | tar -x -C "$export_dir"
config=results/vs_ray_tune/td3_inverted_double_pendulum_sweep.yaml
for strategy in pbt pb2; do
  (cd "$export_dir" && PYTHONPATH="$export_dir" python -m fastpop train "$config" \
    --set strategy=$strategy --out "$out/fastpop_$strategy" > "$out/fastpop_$strategy.log" 2>&1)
done
for scheduler in pbt pb2; do
  "$ray_python" results/vs_ray_tune/ray_sweep.py --scheduler $scheduler --synch \
    --out "$out/ray_$scheduler" > "$out/ray_$scheduler.log" 2>&1
done
python results/vs_ray_tune/compare.py "$out" --out results/vs_ray_tune
