#!/usr/bin/env bash
# The h200 profile's first configurations on a lent H200, as one command within 10 minutes:
#   run(command="bash benchmarks/device/h200.sh", carry=[".wheels"], timeout_s=600)
# The device image has torch, transformers, peft, psutil and nvidia-ml-py but no TRL, datasets
# or bitsandbytes, and reaches no registry: fill .wheels here first (git-ignored), with
#   pip download --only-binary=:all: --python-version 3.12 -d .wheels "trl==1.16.*" datasets bitsandbytes==0.50.2
# (match --python-version to the image's python3). The result file lands under $OUT.
set -euo pipefail
python3 -m pip install -q --no-index --find-links .wheels "trl==1.16.*" datasets bitsandbytes
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
PYTHONUNBUFFERED=1 python3 -m benchmarks bench --profile h200 --out "${OUT:-results/runs}"
