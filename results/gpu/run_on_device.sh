#!/usr/bin/env bash
# `fastpop bench gpu` on a lent GPU machine (README.md beside this file): installs the carried
# wheels (.whl/, see requirements.txt), runs the benchmark into results/gpu/<gpu model>, and
# packs that directory, less run checkpoints (GBs; a tarball over the device tool's 16 MiB per
# file comes back as nothing), into $OUT/gpu.tgz with the console log beside it.
#   bash results/gpu/run_on_device.sh --short            # one 10-minute remote command
#   bash results/gpu/run_on_device.sh --phases update    # a phase group of the full programme
# Arguments go to `fastpop bench gpu`. BENCH_SECONDS (default 560) caps the benchmark so that
# the packing still runs inside the remote command's 600 s; BENCH_OUT replaces the directory.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=results/gpu/device_env.sh
source results/gpu/device_env.sh
out="${BENCH_OUT:-results/gpu/${model:-unknown-gpu}}"
timeout "${BENCH_SECONDS:-560}" python3 -m fastpop bench gpu --out "$out" "$@" 2>&1 \
  | tee "${OUT:-/tmp}/log.txt"
status=${PIPESTATUS[0]}
tar czf "${OUT:-/tmp}/gpu.tgz" --exclude=checkpoints "$out"
ls -la "${OUT:-/tmp}"
exit "$status"
