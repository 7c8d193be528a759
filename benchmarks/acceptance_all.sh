#!/usr/bin/env bash
# The committed acceptance set: every drafter x workload x temperature for SmolLM2-135M on the CPU.
#   bash benchmarks/acceptance_all.sh            # all phases
#   bash benchmarks/acceptance_all.sh ngram      # one phase: ngram | early-exit
# Writes profiles/acceptance/<drafter>_<workload>_T<t>.json (+ .detail.json) and
# profiles/traces/<drafter>_<workload>_T<t>.csv.gz. Target continuations are cached under
# .cache/tabletune/trajectories and shared by the drafters. Sizes: first NUM_PROMPTS prompts of each
# workload (extraction has 10), up to MAX_NEW_TOKENS generated tokens, k = 8. The early-exit drafter
# uses the first EXIT_LAYER of SmolLM2's 30 layers (default 28, as `tabletune acceptance`).
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_PROMPTS=${NUM_PROMPTS:-8}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-96}
EXIT_LAYER=${EXIT_LAYER:-28}
export TABLETUNE_TORCH_THREADS=${TABLETUNE_TORCH_THREADS:-1}
PHASES=${1:-ngram early-exit}
BIN=.venv/bin

measure() {  # drafter workload temperature [extra args]
  local name="$1_$2_T$3"
  nice -n 19 $BIN/tabletune acceptance --drafter "$1" --workload "$2" --temperature "$3" --k-max 8 \
    --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS" --batch-size "$NUM_PROMPTS" \
    --out "profiles/acceptance/$name.json" --trace-out "profiles/traces/$name.csv.gz" "${@:4}"
}

for phase in $PHASES; do
  case $phase in
    ngram)
      for t in 0 1; do for w in code code-edit chat math extraction; do measure ngram "$w" "$t"; done; done ;;
    early-exit)
      for t in 0 1; do for w in code code-edit chat math extraction; do
        measure early-exit "$w" "$t" --exit-layer "$EXIT_LAYER"; done; done ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
