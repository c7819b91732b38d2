#!/usr/bin/env bash
# The guide's size-class questions on one H200, as one command within 9 minutes. Its parts run in this
# order, each under `timeout` at its own budget (PLAN below), each writing its result file as it measures,
# so that a part cut at its budget loses at most what it had in progress and the next part still runs:
#
#   check     the machine: an H200 (else the script stops: nothing is filed under a class it is not), the
#             trainer's imports, a one-layer NF4 model in bf16, runtime, git, package versions and whether they
#             meet the carried wheels' requirements, NVML, expandable segments (a text file); a failed gate
#             skips the parts that need it: the trainer every GRPO part, 4-bit the 3B (8-bit AdamW) and 70B
#             (NF4) rows; decode needs neither and runs
#   grpo-3b   the 24 GB row: 3B, full fine-tuning, 8-bit AdamW, checkpointing, allocator capped at 22.5 GiB
#   grpo-32b  the H200 row: 32B, LoRA, checkpointing
#   decode    8B bf16 decode in CUDA graphs at batch 1 and 64: GB/s against the ceiling and the spec
#   grpo-70b  toward the B200 row: 70B, QLoRA, checkpointing
#
# Every model is made on the GPU from profiles/shapes.toml (no checkpoint on disk). No vLLM runs there:
# its engine's memory stays predicted (`python -m benchmarks estimate`), and rollouts are transformers'.
#
# For the H200 image lent to this project (profiles/images.toml: torch, transformers, peft, accelerate, psutil,
# nvidia-ml-py, pyarrow, pandas and more, but no TRL, datasets or bitsandbytes, no git and no network). Once,
# where the checkout is and PyPI answers, from the repository root:
#
#   bash benchmarks/device/h200.sh --prepare   # the wheels (~45 MB, git-ignored) and the commit's record
#   bash benchmarks/device/h200.sh --plan      # the parts and their budgets; exits 1 past 9 minutes
#   bash benchmarks/device/h200.sh --rehearse  # the same flow on this machine, tiny shapes (--quick)
#   nox -s rehearse                            # that flow in an environment shaped like the image
#
# then on the GPU machine (the device tool: kind="nvidia-h200", carry=[".wheels", ".grpo-bench-commit.json"],
# timeout_s=600; on another kind the check stops it in seconds):
#
#   bash benchmarks/device/h200.sh
#
# Result files land under $OUT (the device tool brings them back) or else results/runs; commit them under
# results/runs/h200/.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:-run}"
PLAN_LIMIT_S=540
PARTS=(check grpo-3b grpo-32b decode grpo-70b)
declare -A BUDGET_S=([check]=30 [grpo-3b]=80 [grpo-32b]=120 [decode]=180 [grpo-70b]=120)
declare -A PROFILE=([grpo-3b]="h200-24gb-row --only grpo" [grpo-32b]="h200 --only grpo" [decode]="h200 --only decode"
  [grpo-70b]="h200-70b --only grpo")

planned=0
for part in "${PARTS[@]}"; do planned=$((planned + BUDGET_S[$part])); done
if [ "$mode" = --plan ] || [ "$planned" -gt "$PLAN_LIMIT_S" ]; then
  for part in "${PARTS[@]}"; do printf '%-9s %4d s\n' "$part" "${BUDGET_S[$part]}"; done
  printf 'planned   %4d s of %d\n' "$planned" "$PLAN_LIMIT_S"
  [ "$planned" -le "$PLAN_LIMIT_S" ] && exit 0 || exit 1
fi

if [ "$mode" = --prepare ]; then
  # what the image lacks, as profiles/images.toml declares it (`nox -s rehearse` installs the same)
  mapfile -t carried < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("profiles/images.toml", "rb"))["h200"]["carried"]))')
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform any -d .wheels "${carried[@]}"
  python3 -c 'from benchmarks.run.machine.provenance import write_provenance; print("provenance:", write_provenance().short, "(commit nothing more before the run, or write it again: python -m benchmarks provenance)")'
  du -sh .wheels
  exit 0
fi

quick=()
kind=(--kind h200)  # the check's first gate: the machine is the class every file is filed under
margin_s=8  # a part's configurations end this long before its budget: time to record them
if [ "$mode" = --rehearse ]; then
  quick=(--quick)  # the profiles' tiny shapes; the CUDA-only steps skip themselves, saying why
  kind=()  # this CPU is no H200: the rehearsal checks the flow, not the machine
  # an overrun rehearsed: a part's budget ("grpo-3b=60") and how long before its end its configurations must stop
  for given in ${H200_BUDGETS:-}; do BUDGET_S[${given%=*}]=${given#*=}; done
  margin_s=${H200_DEADLINE_MARGIN_S:-$margin_s}
  [ -n "${H200_PARTS:-}" ] && read -ra PARTS <<<"$H200_PARTS"  # the parts a rehearsal is about ("grpo-3b")
elif [ "$mode" = run ]; then
  # a result names the commit that ran: this tree must be the one its record was written from (no git here)
  if ! python3 -c 'import sys; from benchmarks.run.machine.provenance import commit; c = commit(); print(f"commit: {c.id} ({c.source})"); sys.exit(0 if c.id and not c.dirty else 3)'; then
    echo "stop: this tree is not the commit its record names: run 'python -m benchmarks provenance' where the checkout is, after the last commit and right before the run"
    exit 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/grpo-bench-site \
    .wheels/*.whl
  export PYTHONPATH="/tmp/grpo-bench-site${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "unknown mode $mode: none, --plan, --prepare or --rehearse"
  exit 2
fi
export PYTHONUNBUFFERED=1
results="${OUT:-results/runs}"
mkdir -p "$results/h200"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
exec > >(tee "$results/h200/$stamp-h200-log.txt") 2>&1

declare -A ended skip
for part in "${PARTS[@]}"; do
  if [ -n "${skip[$part]:-}" ]; then
    ended[$part]="skipped: ${skip[$part]}"
    echo "== $part: ${ended[$part]} =="
    continue
  fi
  echo "== $part (budget ${BUDGET_S[$part]} s) =="
  if [ "$part" = check ]; then
    command=(python3 -m benchmarks.run.machine.preflight "$results/h200/$stamp-check.txt" "${kind[@]}")
  else
    read -ra chosen <<<"${PROFILE[$part]}"
    # its configurations end ~8 s before the part's budget, as timeout records with their phase, not cut from outside
    deadline=$(($(date +%s) + BUDGET_S[$part] - margin_s))
    command=(python3 -m benchmarks bench --profile "${chosen[@]}" --out "$results" --deadline "$deadline" "${quick[@]}")
  fi
  status=0
  timeout --signal=TERM --kill-after=10 "${BUDGET_S[$part]}" "${command[@]}" || status=$?
  if [ "$part" = check ] && [ "$status" -ne 0 ] && [ "$status" -lt 8 ]; then  # its gates (a timeout is none)
    if [ $((status & 4)) -ne 0 ]; then
      echo "check: this machine is not an H200 (see its file): nothing measured; ask the device tool for kind nvidia-h200"
      exit 4
    fi
    if [ $((status & 1)) -ne 0 ]; then
      for gated in grpo-3b grpo-32b grpo-70b; do skip[$gated]="the trainer does not import here (see the check)"; done
    fi
    if [ $((status & 2)) -ne 0 ]; then
      for gated in grpo-3b grpo-70b; do skip[$gated]="${skip[$gated]:-the bitsandbytes CUDA kernels failed (see the check)}"; done
    fi
    echo "check: a gate failed (exit $status): the parts that need it are skipped, the rest run"
    ended[$part]="gate failed (exit $status)"
    continue
  fi
  case $status in
    0) ended[$part]="done" ;;
    124) ended[$part]="cut at its ${BUDGET_S[$part]} s budget: its file keeps what it measured (complete: false)" ;;
    *) ended[$part]="failed (exit $status): see the log above" ;;
  esac
done
# At most 7 files come back from the device: the decode part's table and figure are made again here from its file
# (`python -m benchmarks decode-report FILE`), so they stay behind
for made in "$results"/h200/*-decode.md "$results"/h200/*-decode.png; do
  if [ -e "$made" ] && [[ "$(basename "$made")" > "$stamp" ]]; then rm -f "$made"; fi  # this run's only
done
echo "== summary =="
failed=0
for part in "${PARTS[@]}"; do
  echo "$part: ${ended[$part]}"
  [ "${ended[$part]}" = done ] || failed=1
done
exit "$failed"
