#!/usr/bin/env bash
# The max-context claim on one H200, as one command within 9 minutes: Unsloth's GPU path (its
# efficient GRPO loss) against TRL 1.14.2 (materialised logits), TRL 1.16 (its tiled LM head) and
# TRL 1.16 with Liger's kernels, at the budget of the h200 profile's [context] table (torch's allocator
# capped at it), with the model-guided search. Each stack runs unmodified in its own interpreter: a
# wrapper that puts that stack's packages, then the shared ones, before the machine's own.
#
# For a machine with torch, transformers 5.17, peft, accelerate, psutil, nvidia-ml-py, pyarrow, pandas
# and xxhash but no TRL, datasets, bitsandbytes or Unsloth, and no network (the H200 lent to this
# project). Once, on a machine that reaches PyPI, from the repository root:
#
#   bash benchmarks/device/context-h200.sh --prepare
#
# installs each stack's wheels (--no-deps: the GPU machine has torch and CUDA's libraries) for that
# machine's Python 3.12 under .context-site/ (git-ignored), leaves out what no probe imports
# (Unsloth's Studio app, bitsandbytes' libraries for CUDA before 13, ROCm and XPU) and prints the
# size: about 50 MiB, which with the tree stays under the 64 MiB that travels. Then, on the GPU machine, in the repository root:
#
#   bash benchmarks/device/context-h200.sh     # the device tool: kind="nvidia-h200",
#                                              # carry=[".context-site", ".grpo-bench-commit.json"]
#   bash benchmarks/device/context-h200.sh --all-contenders   # TRL 1.16 and Liger too, after the pair
#
# `--rehearse` runs the same flow here on the profile's tiny shapes (--quick), every contender by this
# machine's python3 (a stack missing here ends as an error, a CUDA-only one as skipped, each saying why).
#
# CONTEXT_SECONDS (default 510) bounds the whole search, warm-ups included. By default only the claim's pair
# runs (--all-contenders: every contender of the profile, the pair first). Every contender runs under the same
# allocator settings, each stack first takes one untimed warm-up step within a probe's time limit (Unsloth
# compiles its loss in every new process), and the file is written after every probe with the verdict so far:
# a search cut at its limit keeps every probe that ended and says `complete: false`. Result
# files land under $OUT (the device tool brings them back) or else results/runs; commit them under
# results/runs/h200/. The wheel list follows each wheel's metadata; it has not yet run on the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
site=.context-site

if [ "${1:-}" = "--prepare" ]; then
  install() {  # a stack's directory, then its wheels
    local target="$site/$1"
    shift
    python3 -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform any --no-compile --target "$target" "$@"
  }
  rm -rf "$site"
  # What every TRL needs beyond the machine's packages (datasets at TRL's floor, >=4.7, and below 5:
  # Unsloth's bound), and bitsandbytes, which Unsloth and TRL's PEFT paths import.
  install common "datasets==4.8.4" "dill==0.4.1" "multiprocess==0.70.19" "bitsandbytes==0.50.2"
  find "$site/common/bitsandbytes" \( -name 'libbitsandbytes_cuda1[0-2]*.so' -o -name 'libbitsandbytes_rocm*.so' \
    -o -name 'libbitsandbytes_xpu*.so' \) -delete
  install trl-1.14.2 "trl==1.14.2"
  install trl-1.16 "trl==1.16.0"
  install liger "liger-kernel==0.8.5"
  # Unsloth 2026.10.9 pins trl<=1.15 and transformers<=5.17 (the machine's); the rest is its and
  # unsloth_zoo's requirements that the machine lacks (hf_transfer, a downloader it imports only if
  # present, is left out: nothing is downloaded).
  install unsloth "unsloth==2026.10.9" "unsloth_zoo==2026.10.9" "trl==1.15.0" "cut_cross_entropy==25.1.1" \
    "tyro==1.0.17" "docstring-parser==0.18.0" "shtab==1.13.0" "typeguard==4.6.1" "msgspec==0.23.0" \
    "json5==0.17.3" "nest-asyncio==1.6.0" "structlog==26.1.0"
  rm -rf "$site/unsloth/studio" "$site/unsloth/unsloth_cli"
  python3 -c 'from benchmarks.run.machine.provenance import write_provenance; print("provenance:", write_provenance().short)'
  du -sh "$site" "$site"/*
  exit 0
fi

# The claim's pair alone by default (Unsloth against the unchunked TRL 1.14.2), so that the budget goes to the
# claim; --all-contenders adds TRL 1.16 and Liger after them
contenders=(--contenders trl-1.14.2,unsloth-2026.10.9)
for arg in "$@"; do [ "$arg" = --all-contenders ] && contenders=(); done
quick=()
if [ "${1:-}" = "--rehearse" ]; then
  quick=(--quick)
elif [ ! -d "$site/common" ]; then
  echo "no $site: run 'bash $0 --prepare' first, on a machine that reaches PyPI"
  exit 2
elif ! python3 -c 'import sys; from benchmarks.run.machine.preflight import failed, kind; k = kind("h200"); print("kind:", k); sys.exit(4 if failed(k) else 0)'; then
  echo "stop: this machine is not an H200: nothing measured; ask the device tool for kind nvidia-h200"
  exit 4
fi
bin="$(mktemp -d /tmp/grpo-bench-context.XXXXXX)"
interpreter() {  # a contender's name, then its site directories, first on the path (none when rehearsing)
  local name=$1 path=""
  shift
  [ ${#quick[@]} -eq 0 ] && for dir in "$@"; do path="$path$PWD/$site/$dir:"; done
  printf '#!/bin/sh\nexport PYTHONPATH="%s%s"\nexec python3 "$@"\n' "$path" "$PWD" >"$bin/$name"
  chmod +x "$bin/$name"
}
interpreter trl-1.14.2 trl-1.14.2 common
interpreter trl-1.16 trl-1.16 common
interpreter trl-1.16-liger liger trl-1.16 common
interpreter unsloth-2026.10.9 unsloth common
export PYTHONUNBUFFERED=1
results="${OUT:-results/runs}"
status=0
timeout --signal=TERM --kill-after=10 "${CONTEXT_SECONDS:-510}" "$bin/trl-1.16" -m benchmarks context --profile h200 \
  "${quick[@]}" "${contenders[@]}" --out "$results" --python "trl-1.14.2=$bin/trl-1.14.2" --python "trl-1.16=$bin/trl-1.16" \
  --python "trl-1.16-liger=$bin/trl-1.16-liger" --python "unsloth-2026.10.9=$bin/unsloth-2026.10.9" || status=$?
if [ "$status" = 124 ]; then
  echo "the search reached CONTEXT_SECONDS: its file keeps the contenders it measured and says complete: false"
elif [ "$status" != 0 ]; then
  exit "$status"
fi
