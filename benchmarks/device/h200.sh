#!/usr/bin/env bash
# The h200 profile on one H200, as one command within 9 minutes: the decode part (the device's own
# bandwidth ceiling, then transformers decode; vLLM is recorded as skipped where it is not installed),
# then the GRPO configurations in order, each bounded by the profile's configuration_timeout_s and
# all of them by GRPO_SECONDS (a run cut there is written with `complete: false` and why).
#
# For a machine with torch, transformers, peft, accelerate, psutil, nvidia-ml-py, pyarrow, pandas and
# xxhash but no TRL, datasets or bitsandbytes, and no network (the H200 lent to this project). Once,
# on a machine that reaches PyPI, from the repository root (the wheels are git-ignored; ~45 MB, so
# the tree that travels stays under 64 MiB; match --python-version to the GPU machine's python3):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform any -d .wheels "trl==1.16.0" "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19" \
#     "bitsandbytes==0.50.2"
#
# (--no-deps: pip would otherwise pull gigabytes of CUDA libraries the machine already has; dill and
# multiprocess are what datasets needs beyond the machine's packages.) Then, on the GPU machine, in the
# repository root:
#
#   bash benchmarks/device/h200.sh            # with the device tool: carry=[".wheels"], timeout_s=600
#
# Result files land under $OUT (the device tool brings them back) or else results/runs; commit them
# under results/runs/h200/.
set -euo pipefail
cd "$(dirname "$0")/../.."
GRPO_SECONDS="${GRPO_SECONDS:-390}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/grpo-bench-site .wheels/*.whl
export PYTHONPATH="/tmp/grpo-bench-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
results="${OUT:-results/runs}"
python3 -m benchmarks bench --profile h200 --only decode --out "$results"
status=0
timeout --signal=TERM --kill-after=30 "$GRPO_SECONDS" python3 -m benchmarks bench --profile h200 --only grpo --out "$results" || status=$?
if [ "$status" = 124 ]; then
  echo "the GRPO part reached GRPO_SECONDS=$GRPO_SECONDS: its file lists what ran and says complete: false"
elif [ "$status" != 0 ]; then
  exit "$status"
fi
