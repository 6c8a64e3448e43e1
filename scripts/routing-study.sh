#!/usr/bin/env bash
# The routing quality study of docs/routing.md: perplexity, expert hit rate and
# average k of the oracle model with its expert pool at 25% and 50%, for the
# residency penalty's alpha in {0, 0.5, 1, 2, 4} and for dynamic k with p in
# {0.5, 0.7, 0.9} (alpha 0). Prints a markdown table on stdout.
#
#   scripts/routing-study.sh [BUILD_DIR] [MODEL] [BATCH] [CHUNKS]
#
# BUILD_DIR holds bin/moert-perplexity (default build/x86); MODEL defaults to the
# Q4_0 oracle; BATCH is the tokens per forward pass (default 1: decode-like steps,
# where residency matters on a device; 64 is prefill-like); CHUNKS limits the
# 128-token chunks of valid.txt scored (default 0: all 361).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/x86}
model=${2:-../shared/models/tiny-moe-shakespeare-q4_0.gguf}
batch=${3:-1}
chunks=${4:-0}
text=../shared/models/valid.txt
tool="$build/bin/moert-perplexity"
[[ -x $tool ]] || { echo "routing-study.sh: no $tool (build it first)" >&2; exit 1; }

run() {  # pool alpha p -> one table row
  local pool=$1 alpha=$2 p=$3 args=() err
  args=(-m "$model" -f "$text" -c 128 -b "$batch" -t 1 --io buffered --expert-pool "$pool"
        --router-alpha "$alpha")
  [[ $chunks != 0 ]] && args+=(--chunks "$chunks")
  [[ $p != - ]] && args+=(--dynamic-k "$p")
  err=$(mktemp)
  local ppl
  ppl=$("$tool" "${args[@]}" 2>"$err" | sed -n 's/^PPL = \([0-9.]*\).*/\1/p')
  local hit k changed
  hit=$(sed -n 's/.*hit rate \([0-9.]*\)%.*/\1/p' "$err")
  k=$(sed -n 's/.*average k \([0-9.]*\),.*/\1/p' "$err")
  changed=$(sed -n 's/.*choice changed at \([0-9.]*\)%.*/\1/p' "$err")
  rm -f "$err"
  printf '| %s%% | %s | %s | %s | %s%% | %s | %s%% |\n' \
    "$(awk "BEGIN{print $pool*100}")" "$alpha" "$p" "$ppl" "$hit" "$k" "$changed"
}

echo "model $(basename "$model"), batch $batch, chunks ${chunks/#0/all}"
echo
echo "| pool | alpha | dynamic k p | PPL | hit rate | average k | choice changed |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for pool in 0.25 0.5; do
  for alpha in 0 0.5 1 2 4; do run "$pool" "$alpha" -; done
  for p in 0.5 0.7 0.9; do run "$pool" 0 "$p"; done
done
