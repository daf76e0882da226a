# Sourced by run_on_device.sh and lever_runs.sh on a lent GPU machine, from the repository's root:
# installs the carried wheels (.whl/, see requirements.txt) into /tmp/site, puts them and the
# repository on PYTHONPATH, and sets `model` to the GPU's name as a directory name.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-')
