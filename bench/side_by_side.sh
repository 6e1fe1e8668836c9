#!/usr/bin/env bash
# Several gpu_suite.sh runs side by side, one GPU each, on a machine with several GPUs:
#   bash bench/side_by_side.sh "ENV=... stage ..." "ENV=... stage ..." ...
# The Nth argument runs on GPU N-1 (CUDA_VISIBLE_DEVICES), into $OUT/gN-1/ (its results.tgz and
# suite.log), each with DEADLINE (default 570 s); then AFTER (the same form) on every GPU at once,
# into $OUT/all/, within AFTER_DEADLINE (default 120 s). Wheels are installed once, first.
set -u
FINAL=${OUT:-out}
OUT=/tmp/side-by-side-env bash "$(dirname "$0")/gpu_suite.sh" env > /dev/null 2>&1
suite() {  # suite OUT_DIR DEADLINE "VAR=value ... stage ...": one gpu_suite.sh run, logged to OUT_DIR/suite.log
  mkdir -p "$1"
  (export OUT=$1 DEADLINE=$2
   eval "set -- $3"; settings=()
   while [ $# -gt 0 ] && [[ $1 == *=* ]]; do settings+=("$1"); shift; done  # VAR=value words, then stages
   env "${settings[@]}" bash "$(dirname "$0")/gpu_suite.sh" "$@" > "$OUT/suite.log" 2>&1)
}
gpu=0
for job in "$@"; do
  CUDA_VISIBLE_DEVICES=$gpu suite "$FINAL/g$gpu" "${DEADLINE:-570}" "$job" &
  gpu=$((gpu + 1))
done
wait
[ -n "${AFTER:-}" ] && suite "$FINAL/all" "${AFTER_DEADLINE:-120}" "$AFTER"  # then one run on every GPU
tail -n 40 "$FINAL"/g*/suite.log "$FINAL"/all/suite.log 2>/dev/null
